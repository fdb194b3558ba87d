#!/usr/bin/env bash
# Build TensorRT plans from the exported ONNX models, on the GPU that will serve them.
#
#   deploy/model-build/trtexec.sh [MODEL_REPOSITORY]      (default: model_repository)
#
# Run it on a GPU host inside NVIDIA's Triton or TensorRT container of the same release
# as the serving Triton (both ship /usr/src/tensorrt/bin/trtexec): a plan only runs on
# the TensorRT version and GPU model that built it. It cannot run on a machine without
# a GPU. First export the ONNX files (python deploy/model-build/build.py).
#
# Environment:
#   TRTEXEC     path to trtexec (default: trtexec on PATH, else /usr/src/tensorrt/bin/trtexec)
#   PRECISION   fp16 (default) or fp32
#   FORCE=1     rebuild plans that are newer than their ONNX file
set -euo pipefail

repository=${1:-model_repository}
precision=${PRECISION:-fp16}
trtexec=${TRTEXEC:-$(command -v trtexec || echo /usr/src/tensorrt/bin/trtexec)}

# name | ONNX input(s) | min shape | opt shape | max shape  (batch first; must match
# max_batch_size and dims in the model's config.pbtxt). Several inputs sharing one shape
# are written "a:%s,b:%s". text_model: batch 1..64 x sequence 1..256 tokens.
plans=(
  "image_model|input|1x3x224x224|8x3x224x224|32x3x224x224"
  "text_model|input_ids:%s,attention_mask:%s|1x1|8x64|64x256"
)

# "input" + "1x3x224x224" -> input:1x3x224x224; "a:%s,b:%s" + "1x1" -> a:1x1,b:1x1
shapes() {
  if [[ $1 == *%s* ]]; then
    printf '%s' "${1//%s/$2}"
  else
    printf '%s:%s' "$1" "$2"
  fi
}

build() {
  local name=$1 input=$2 min=$3 opt=$4 max=$5
  local onnx="$repository/$name/1/model.onnx" plan="$repository/$name/1/model.plan"
  if [[ ! -f $onnx ]]; then
    echo "[trtexec] $onnx is missing: run deploy/model-build/build.py first" >&2
    return 1
  fi
  if [[ -f $plan && $plan -nt $onnx && ${FORCE:-0} != 1 ]]; then
    echo "[trtexec] $plan is up to date"
    return 0
  fi
  local flags=()
  [[ $precision == fp16 ]] && flags+=(--fp16)
  echo "[trtexec] building $plan ($precision, shapes $min .. $max, optimum $opt)"
  "$trtexec" \
    --onnx="$onnx" \
    --saveEngine="$plan.tmp" \
    --minShapes="$(shapes "$input" "$min")" \
    --optShapes="$(shapes "$input" "$opt")" \
    --maxShapes="$(shapes "$input" "$max")" \
    --skipInference \
    "${flags[@]}"
  mv "$plan.tmp" "$plan"
}

for spec in "${plans[@]}"; do
  IFS='|' read -r name input min opt max <<<"$spec"
  build "$name" "$input" "$min" "$opt" "$max"
done
