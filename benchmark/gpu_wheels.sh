#!/usr/bin/env bash
# Fills .whl/ with what benchmark/gpu_throughput.sh installs on a GPU machine that has no internet:
# the Python 3.12 wheels of the packages such a machine's image lacks (its image has torch and jax
# with CUDA, flax, optax, tensorboard, numpy, matplotlib, absl-py, wrapt, attrs), and envpool cut
# down to its Atari part. Run it once from the repository root on a machine with pip access:
#
#     bash benchmark/gpu_wheels.sh && du -sh .whl
#
# Why the cut: envpool's wheel (53 MB) and its assets (62 MB) are mostly other simulators
# (MuJoCo, ViZDoom, ...), and what travels to the GPU machine is limited to 64 MiB. The Atari
# part is envpool's Python package, its Atari extension and the Atari ROMs (about 6 MB packed).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$1" "${@:2}"
}
download .whl gymnasium==1.4.0 farama-notifications ale-py==0.12.1 tyro==1.0.17 docstring-parser typeguard \
  dm-env dm-tree optree glfw

staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
download "$staging" envpool==1.2.5 "envpool-assets>=0.3,<0.4"
mkdir -p "$staging/site"
python3 -m zipfile -e "$staging"/envpool-1.2.5-*.whl "$staging/site"
python3 -m zipfile -e "$staging"/envpool_assets-*.whl "$staging/assets"
# Keep the core and Atari; register Atari alone, and put the ROMs where envpool looks first.
package="$staging/site/envpool"
for family in "$package"/*/; do
  case "$(basename "$family")" in atari|python) ;; *) rm -rf "$family" ;; esac
done
echo "import envpool.atari.registration  # noqa: F401  (cut down to Atari by benchmark/gpu_wheels.sh)" \
  > "$package/entry.py"
cp -r "$staging/assets/envpool_assets/atari/roms" "$package/atari/roms"
(cd "$staging/site" && tar -czf "$root/.whl/envpool-1.2.5-atari-cp312.tar.gz" envpool envpool.libs)
ls -l "$root/.whl"
