#!/usr/bin/env bash
# A Docker engine of the project's own, for `sam local invoke` (infra/sam-local-invoke.sh), and the
# stand-in Lambda base image it runs the functions in. Nothing else on the machine is affected: the
# engine has its own socket, data root and pid file under .local/docker/, no iptables rules and no
# NAT; containers reach the host over the default bridge only (docker0, 172.17.0.1).
#
#   infra/docker.sh install   docker.io + debootstrap from Debian's packages when missing (apt)
#   infra/docker.sh start     start the engine (no-op when it answers); prints DOCKER_HOST
#   infra/docker.sh rootfs    the stand-in's root file system (debootstrap, ~45 s; no engine needed)
#   infra/docker.sh image     the stand-in base image, from rootfs (made first when missing)
#   infra/docker.sh stop      stop the engine; fine when not running
#   infra/docker.sh env       print `export DOCKER_HOST=...` (eval it)
#   infra/docker.sh bridge    print the bridge address containers reach the host at
#
# The stand-in image: no image registry is reachable from these machines, so SAM cannot pull
# public.ecr.aws/lambda/provided:al2023. `image` builds a Debian 12 minbase root file system with
# CA certificates (debootstrap, from Debian's package registry) and tags it with that name; SAM
# adds its Runtime Interface Emulator on top as it does on the real image. It is Debian 12 (glibc
# 2.36), NOT Amazon Linux 2023 (glibc 2.34): a binary that needs a newer glibc than AL2023 has
# would start here and fail on AWS (infra/sam-local-invoke.sh checks the built binaries' glibc
# symbol versions against AL2023's). On a machine that can pull images, skip `image` and let SAM
# pull the real one.
set -euo pipefail

# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"

DK="${SAS_DOCKER_DIR:-$SAS_LOCAL_DIR/docker}"
SOCK="$DK/docker.sock"
readonly IMAGE="public.ecr.aws/lambda/provided:al2023" # the tag SAM expects; ours is a stand-in
readonly BRIDGE="172.17.0.1"                           # docker0's address (dockerd's default bridge)

log() { printf '[docker] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# A unix socket path is limited to 107 bytes.
[ "${#SOCK}" -lt 100 ] || die "socket path too long (${#SOCK} bytes): set SAS_DOCKER_DIR to a shorter folder"
export DOCKER_HOST="unix://$SOCK"

answers() { [ -S "$SOCK" ] && docker info >/dev/null 2>&1; }

cmd_install() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  if [ "${#missing[@]}" -eq 0 ]; then
    log "dockerd and debootstrap present"
    return 0
  fi
  [ "$(id -u)" = 0 ] || die "missing ${missing[*]}: install them (apt-get install ${missing[*]}) or run as root"
  log "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

cmd_start() {
  if answers; then
    log "already running (DOCKER_HOST=$DOCKER_HOST)"
    return 0
  fi
  command -v dockerd >/dev/null 2>&1 || die "dockerd not found: infra/docker.sh install"
  [ "$(id -u)" = 0 ] || die "dockerd needs root here"
  mkdir -p -- "$DK"
  rm -f -- "$SOCK" "$DK/docker.pid"
  log "starting dockerd (socket $SOCK, data root ${DK#"$SAS_ROOT"/}/data, log ${DK#"$SAS_ROOT"/}/dockerd.log)"
  # --iptables=false --ip-masq=false: no rules added to the machine's firewall, no NAT; published
  # ports (SAM maps the emulator's) go through docker-proxy on 127.0.0.1.
  setsid dockerd -H "$DOCKER_HOST" --data-root "$DK/data" --exec-root "$DK/exec" \
    --pidfile "$DK/docker.pid" --iptables=false --ip-masq=false --storage-driver=overlay2 \
    </dev/null >"$DK/dockerd.log" 2>&1 &
  local i
  for ((i = 0; i < 60; i++)); do
    if answers; then
      log "ready in $((i / 2)) s; DOCKER_HOST=$DOCKER_HOST; bridge $(cmd_bridge)"
      return 0
    fi
    sleep 0.5
  done
  tail -n 30 "$DK/dockerd.log" >&2 || true
  die "dockerd did not answer within 30 s"
}

cmd_rootfs() {
  local rootfs="$DK/rootfs" start=$SECONDS
  if [ -x "$rootfs/usr/bin/env" ] && [ -f "$rootfs/.complete" ]; then
    log "root file system present (${rootfs#"$SAS_ROOT"/})"
    return 0
  fi
  command -v debootstrap >/dev/null 2>&1 || die "debootstrap not found: infra/docker.sh install"
  mkdir -p -- "$DK"
  log "debootstrap --variant=minbase --include=ca-certificates bookworm (Debian's package registry)"
  rm -rf -- "$rootfs"
  debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" >"$DK/debootstrap.log" 2>&1 \
    || { tail -n 20 "$DK/debootstrap.log" >&2; die "debootstrap failed"; }
  touch "$rootfs/.complete"
  log "root file system made in $((SECONDS - start)) s"
}

cmd_image() {
  answers || die "the engine is not running: infra/docker.sh start"
  if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "image $IMAGE present ($(docker image inspect -f '{{.Comment}}' "$IMAGE"))"
    return 0
  fi
  local rootfs="$DK/rootfs" start=$SECONDS
  cmd_rootfs
  # Without CA certificates the AWS SDK's TLS set-up finds no roots; the real image has them.
  [ -s "$rootfs/etc/ssl/certs/ca-certificates.crt" ] || die "the stand-in has no CA certificates"
  tar -C "$rootfs" -c . | docker import \
    -m "stand-in for the Lambda base image: Debian 12 minbase + ca-certificates (not Amazon Linux 2023)" \
    - "$IMAGE" >/dev/null
  log "image $IMAGE built in $((SECONDS - start)) s: a STAND-IN (Debian 12, glibc 2.36), not Amazon Linux 2023"
}

cmd_stop() {
  local pid
  pid="$(cat "$DK/docker.pid" 2>/dev/null || true)"
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    log "not running"
    return 0
  fi
  log "stopping dockerd (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  local i
  for ((i = 0; i < 40; i++)); do
    kill -0 "$pid" 2>/dev/null || { log "stopped"; return 0; }
    sleep 0.5
  done
  log "still running after 20 s: SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
}

cmd_bridge() {
  local addr
  addr="$(ip -4 -o addr show docker0 2>/dev/null | awk '{print $4}' | cut -d/ -f1 || true)"
  printf '%s\n' "${addr:-$BRIDGE}"
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start ;;
  rootfs) cmd_rootfs ;;
  image) cmd_image ;;
  stop) cmd_stop ;;
  env) printf 'export DOCKER_HOST=%q\n' "$DOCKER_HOST" ;;
  bridge) cmd_bridge ;;
  *) echo "usage: $0 install|start|rootfs|image|stop|env|bridge" >&2; exit 2 ;;
esac
