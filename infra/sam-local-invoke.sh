#!/usr/bin/env bash
# make sam-local-invoke: `sam local invoke` of the five functions, built by `sam build`, in Lambda
# containers against LocalStack, each fed a real message another role sent; what each did is checked
# in LocalStack (infra/sam_local_invoke.py says what and how).
#
# Steps: a Docker engine of the project's own and the stand-in base image (infra/docker.sh: no
# image registry is reachable here, so the image is Debian 12 minbase, NOT Amazon Linux 2023),
# LocalStack listening on the Docker bridge too, the stack's resources (functions off: the functions
# run under SAM), the order service on the bridge, the invocations, then everything it started
# stopped and the stack deleted. Needs root (dockerd) and `sam build`'s output (.aws-sam/build;
# built here with infra/sam-build.sh x86_64 when missing). Knobs: SAM_LOCAL_STACK (sas-samlocal),
# ORDER_SERVICE_PORT (8093), SAS_KEEP_DOCKER=1 leaves the engine running.
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

STACK="${SAM_LOCAL_STACK:-sas-samlocal}"
WORK="$SAS_LOCAL_DIR/sam-local"
SVC_PORT="${ORDER_SERVICE_PORT:-8093}"
log() { printf '[sam-local-invoke] %s\n' "$*" >&2; }

infra/sam-build.sh --if-missing x86_64
cargo build -q --workspace --bins # sasctl, order-service; --workspace as every build of the scripts
# The functions must start in AL2023 (glibc 2.34): the stand-in's newer glibc would hide a binary
# built against a newer one.
python3 - <<'PY'
import re, subprocess, sys, pathlib
bad = []
for b in sorted(pathlib.Path(".aws-sam/build").glob("*/bootstrap")):
    out = subprocess.run(["objdump", "-T", str(b)], capture_output=True, text=True).stdout
    need = max((tuple(map(int, v.split("."))) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", out)), default=(0,))
    print(f"[sam-local-invoke] {b.parent.name}: needs glibc {'.'.join(map(str, need))}", file=sys.stderr)
    if need > (2, 34):
        bad.append(b.parent.name)
sys.exit(f"built against a glibc newer than Amazon Linux 2023's 2.34: {bad}" if bad else 0)
PY

infra/docker.sh install
started_docker=0
if ! DOCKER_HOST="unix://$SAS_LOCAL_DIR/docker/docker.sock" docker info >/dev/null 2>&1; then
  started_docker=1
fi
infra/docker.sh start
eval "$(infra/docker.sh env)"
infra/docker.sh image
BRIDGE="$(infra/docker.sh bridge)"
ENDPOINT="http://$BRIDGE:$LOCALSTACK_PORT"

# LocalStack, reachable from the containers at the bridge address.
started_localstack=0
if ! curl -fsS -m 2 "$ENDPOINT/_localstack/health" >/dev/null 2>&1; then
  if infra/localstack.sh running; then
    log "LocalStack runs without the bridge address: restarting it with LOCALSTACK_LISTEN_EXTRA=$BRIDGE"
    infra/localstack.sh stop
  fi
  LOCALSTACK_LISTEN_EXTRA="$BRIDGE" infra/localstack.sh ensure
  started_localstack=1
fi

svc_pid=""
cleanup() {
  local rc=$?
  [ -n "$svc_pid" ] && kill "$svc_pid" 2>/dev/null || true
  target/debug/sasctl delete-local --name "$STACK" >/dev/null 2>&1 || true
  if [ "$started_localstack" = 1 ]; then infra/localstack.sh stop || true; fi
  if [ "$started_docker" = 1 ] && [ "${SAS_KEEP_DOCKER:-0}" != 1 ]; then infra/docker.sh stop || true; fi
  exit "$rc"
}
trap cleanup EXIT

rm -rf -- "$WORK" && mkdir -p -- "$WORK"
log "the stack's resources: sasctl deploy-local --name $STACK (functions off; SAM runs them)"
target/debug/sasctl --outputs "$WORK/outputs.json" deploy-local --name "$STACK" >"$WORK/deploy.log"
ORDER_SERVICE_LISTEN="$BRIDGE:$SVC_PORT" target/debug/order-service >"$WORK/order-service.log" 2>&1 &
svc_pid=$!
for _ in $(seq 50); do curl -fsS -m 1 "http://$BRIDGE:$SVC_PORT/healthz" >/dev/null 2>&1 && break; sleep 0.2; done

PATH="$TOOLS_VENV/bin:$PATH" "$TOOLS_VENV/bin/python" infra/sam_local_invoke.py \
  --root "$SAS_ROOT" --outputs "$WORK/outputs.json" --endpoint "$ENDPOINT" \
  --order-service-url "http://$BRIDGE:$SVC_PORT" --order-service-local-url "http://$BRIDGE:$SVC_PORT" \
  --work "$WORK"
