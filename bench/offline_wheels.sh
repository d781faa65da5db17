#!/usr/bin/env bash
# Wheels for running the GPU checks on a machine without network access.
#
# A CUDA machine image usually has PyTorch, torchvision, numpy, OpenCV, h5py,
# Pillow, click and tqdm, and lacks the rest of what fastdata imports. This
# downloads those wheels (and, with --dali, NVIDIA DALI and what it needs) for
# the target's Python and platform, optionally packed into parts of at most
# N MiB for transfers with a size limit.
#
#   bench/offline_wheels.sh DEST [--python 3.12] [--dali] [--skip NAME,...] [--split-mib N]
#
# On the target, from a fastdata checkout (parts first joined, if split):
#
#   cat DEST.part-* | tar xf - -C DEST        # only when --split-mib was given
#   python3 -m pip install --no-index --find-links DEST lmdb simplejpeg crc32c turbojpeg \
#       [nvidia-dali-cuda130]
#   PYTHONPATH=$PWD python3 bench/gpu_check.py
#
# --skip drops wheels of packages the target already has (e.g. numpy,packaging,six),
# which --dali would otherwise download as DALI's dependencies.
set -euo pipefail

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

dest="" python="3.12" dali=0 skip="" split_mib=0
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage 0 ;;
        --python) python="$2"; shift 2 ;;
        --dali) dali=1; shift ;;
        --skip) skip="$2"; shift 2 ;;
        --split-mib) split_mib="$2"; shift 2 ;;
        -*) echo "offline_wheels.sh: unknown option $1" >&2; usage 2 ;;
        *) [ -z "$dest" ] || { echo "offline_wheels.sh: one DEST only" >&2; exit 2; }
           dest="$1"; shift ;;
    esac
done
[ -n "$dest" ] || { echo "offline_wheels.sh: DEST (a folder) is required" >&2; usage 2; }
tag="${python/./}"  # 3.12 -> 312
mkdir -p "$dest"

download() {  # pip download for the target, not for this machine
    python3 -m pip download --quiet --dest "$dest" --only-binary=:all: \
        --python-version "$python" --implementation cp --abi "cp$tag" --abi abi3 --abi none \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any "$@"
}

# fastdata's own dependencies that a CUDA PyTorch image tends to lack (no deps:
# they need nothing beyond numpy, which such an image has).
download --no-deps lmdb simplejpeg crc32c turbojpeg
if [ "$dali" = 1 ]; then
    download nvidia-dali-cuda130
fi
IFS=',' read -r -a skipped <<< "$skip"
for name in "${skipped[@]}"; do
    [ -n "$name" ] || continue
    wheel_name="${name//-/_}"
    rm -f "$dest/${wheel_name}"-[0-9]*.whl "$dest/${name}"-[0-9]*.whl
done

echo "$(ls "$dest"/*.whl | wc -l) wheels, $(du -sm "$dest" | cut -f1) MiB in $dest"
if [ "$split_mib" -gt 0 ]; then
    rm -f "$dest".part-*
    tar cf - -C "$dest" . | split -b "${split_mib}M" - "$dest.part-"
    echo "packed into $(ls "$dest".part-* | wc -l) parts of at most $split_mib MiB: $dest.part-*"
fi
