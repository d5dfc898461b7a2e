# for a later session's peers' file and FlashQLA tables: carry [".fqla2"] (39 MB: FlashQLA 0.1.3 with TileLang and
# FLA in fqla.tar.xz, mamba_ssm's Triton files, simpy / einops / pytest-xdist wheels; no tokenizer wheel, so it
# fits beside the 22 MiB tree, which .fqla's 42 MB no longer does)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .fqla2/*.whl 2>/dev/null
if [ ! -d /tmp/site/flash_qla ]; then mkdir -p /tmp/site && tar -C /tmp/site -xJf .fqla2/fqla.tar.xz; fi
for f in .fqla2/mamba_ssm-*.tar.xz; do [ -f "$f" ] && tar -C /tmp/site -xJf "$f"; done
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FLA_DISABLE_BACKEND_DISPATCH=1
printf '#!/bin/sh\nexec python3 -c "import sys; sys.argv[0] = \\"marconi\\"; from sim.cli import main; main()" "$@"\n' > /tmp/marconi; chmod +x /tmp/marconi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
