# sourced at the start of every device call of this session (run from the repository root)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $(ls .whl/*.whl 2>/dev/null || ls .fqla/*.whl) 2>/dev/null
if [ -z "$NO_FQLA" ] && [ -f .fqla/fqla.tar.xz ] && [ ! -d /tmp/site/flash_qla ]; then mkdir -p /tmp/site && tar -C /tmp/site -xJf .fqla/fqla.tar.xz; fi
for f in .fqla/mamba_ssm-*.tar.xz; do [ -f "$f" ] && tar -C /tmp/site -xJf "$f"; done
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FLA_DISABLE_BACKEND_DISPATCH=1
marconi() { python3 -c "import sys; sys.argv[0] = 'marconi'; from sim.cli import main; main()" "$@"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
git log --oneline -1 2>/dev/null
