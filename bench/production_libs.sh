#!/usr/bin/env bash
# FlashMLA, DeepGEMM (and sgl-kernel's top-k) built on the GPU machine and run through the suite's
# built-in targets flashmla, deepgemm, sgl-kernel (dsv4spec/production.py).  Nothing of theirs is
# committed: the sources travel in the ignored folder .production/ (docs/PRODUCTION.md).
#
#   here, once:    bash bench/production_libs.sh prepare          (needs the fetched mirrors)
#   on the GPU:    bash bench/production_libs.sh run OUTDIR       (carry .production)
#
# OUTDIR receives log.txt and verify_<target>_<profile>.json for each built target at ci and dev.
# VERIFY_S (default 150) bounds each verify run; SEED the dev seed; NVCC_THREADS the nvcc threads;
# LIBS the libraries to build (default: flashmla deepgemm).
set -uo pipefail
MIRROR=${MIRROR:-/work/.mirror}
FLASHMLA_REV=9241ae3ef9bac614dd25e45e507e089f888280e0
DEEPGEMM_REV=54e22612409371d6364144b69086735beb54e98b
export_tree() {   # export_tree GITDIR REV DEST [PATH...]: the tree at REV (only PATHs), no .git
  local git=$1 rev=$2 dest=$3; shift 3
  mkdir -p "$dest" && git --git-dir="$git" archive "$rev" "$@" | tar -x -C "$dest"
}
case "${1:-}" in
prepare)
  rm -rf .production && mkdir -p .production
  export_tree "$MIRROR/deepseek-ai+FlashMLA/repo" $FLASHMLA_REV .production/FlashMLA || exit 1
  rm -rf .production/FlashMLA/benchmark .production/FlashMLA/tests/*.png
  # CUTLASS at each library's submodule commit: only the headers the builds include
  # (a partial mirror may print "invalid object" for files outside these paths: harmless)
  export_tree "$MIRROR/NVIDIA+cutlass/repo" 147f5673d0c1c3dcf66f78d677fd647e4a020219 \
    .production/FlashMLA/csrc/cutlass include tools/util/include || exit 1
  export_tree "$MIRROR/deepseek-ai+DeepGEMM/repo" $DEEPGEMM_REV .production/DeepGEMM || exit 1
  export_tree "$MIRROR/NVIDIA+cutlass/repo" f3fde58372d33e9a5650ba7b80fc48b3b49d40c8 \
    .production/DeepGEMM/third-party/cutlass include || exit 1
  if [ -d "$MIRROR/fmtlib+fmt/repo" ]; then
    export_tree "$MIRROR/fmtlib+fmt/repo" 553ec11ec06fbe0beebfbb45f9dc3c9eabd83d28 .production/DeepGEMM/third-party/fmt include
  else
    echo "fmt missing: fetch github:fmtlib/fmt (DeepGEMM's third-party/fmt, commit 553ec11e)" >&2; exit 1
  fi
  # headers compress about tenfold: carry one archive, not the trees (64 MiB with the checkout)
  tar -C .production -cJf .production/src.tar.xz FlashMLA DeepGEMM && rm -rf .production/FlashMLA .production/DeepGEMM
  du -sh .production/src.tar.xz
  exit 0;;
run)
  out=${2:?usage: bash bench/production_libs.sh run OUTDIR};;
*)
  echo "usage: bash bench/production_libs.sh prepare | run OUTDIR" >&2; exit 2;;
esac

mkdir -p "$out"; log="$out/log.txt"
exec > >(tee -a "$log") 2>&1
t0=$SECONDS; stamp() { echo "[$((SECONDS - t0)) s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nvcc --version | tail -1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
python3 -c "import ninja" 2>/dev/null && echo "ninja: yes" || echo "ninja: no (setuptools compiles one file at a time)"
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
[ -d .production/FlashMLA ] || tar -C .production -xJf .production/src.tar.xz || exit 1
export NVCC_THREADS=${NVCC_THREADS:-4} MAX_JOBS=${MAX_JOBS:-16}
# CUDA 13 keeps libcu++ (cuda/std/...) under include/cccl, which FlashMLA's setup.py does not add
cuda_home=$(python3 -c "from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME)")
export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:-} -I$cuda_home/include/cccl"
export CPLUS_INCLUDE_PATH="$cuda_home/include/cccl${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
seed=${SEED:-$RANDOM}
# One lane a library, side by side: build (BUILD_S), load, then verify at each profile (VERIFY_S).
lane() {   # lane NAME DIR [ENV=VALUE...]
  local name=$1 dir=$2; shift 2
  if ! ( cd "$dir" && env "$@" timeout "${BUILD_S:-420}" python3 -m pip install -v --no-deps --no-build-isolation . ) \
      > "$out/build_$name.txt" 2>&1; then
    stamp "$name build failed"; grep -m5 -i "error" "$out/build_$name.txt"; return
  fi
  stamp "$name built"
  python3 -c "from dsv4spec.production import target; print(target('$name'))" || return
  for p in ${PROFILES:-ci dev}; do
    local extra=(); [ "$p" = dev ] && extra=(--seed "$seed")
    timeout -k 10 "${VERIFY_S:-150}" dsv4spec verify --target "$name" --profile "$p" "${extra[@]}" \
      ${RULES:+--rules $RULES} --json "$out/verify_${name}_$p.json" --quiet > "$out/verify_${name}_$p.txt" 2>&1
    stamp "$name $p exit $?"; tail -3 "$out/verify_${name}_$p.txt"
  done
}
pids=()
case " ${LIBS:-flashmla deepgemm} " in *" flashmla "*) lane flashmla .production/FlashMLA FLASH_MLA_DISABLE_SM100=1 & pids+=($!);; esac
case " ${LIBS:-flashmla deepgemm} " in *" deepgemm "*) lane deepgemm .production/DeepGEMM & pids+=($!);; esac
wait "${pids[@]}"               # by pid: a bare wait would also wait for the tee above, forever
stamp done
