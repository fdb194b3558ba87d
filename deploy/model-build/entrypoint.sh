#!/usr/bin/env bash
# Seed the model repository, export ONNX models and the text label set, build
# TensorRT plans. Each step skips work that is already up to date, so re-running is cheap.
#   entrypoint.sh MODEL_REPOSITORY [--cpu]   (--cpu: ONNX only, for the CPU twin configs)
set -euo pipefail
repository=${1:-/models}
here=$(dirname "$0")
# An empty volume (Kubernetes) gets the committed files; a bind-mounted checkout
# (docker compose) already has them, and newer files there are kept.
if [[ -d $here/model_repository ]]; then
  cp -r --update "$here/model_repository/." "$repository/"
fi
"${MODEL_BUILD_PYTHON:-python3}" "$here/build.py" --repository "$repository"
if [[ ${2:-} != --cpu ]]; then
  "${MODEL_BUILD_PYTHON:-python3}" "$here/plans.py" --repository "$repository"
fi
