#!/usr/bin/env bash
# Container images without a registry or a base-image pull: a directory becomes a one-layer
# docker-archive (the format `docker save` writes and `ctr images import` reads), and archives
# are imported into containerd's k8s.io namespace, where the kubelet finds them.
#
#   docker/local-images.sh rootfs DIR NAME:TAG CONFIG_JSON OUT.tar
#       DIR as the image NAME:TAG; CONFIG_JSON is the image config ({"Entrypoint": [...], "User": ...})
#   docker/local-images.sh libs ROOTFS FILE...
#       copy into ROOTFS, at their host paths, the shared libraries each FILE needs (ldd) and the loader
#   docker/local-images.sh import OUT.tar...
#       import into containerd (socket: $CONTAINERD_ADDRESS, default /run/containerd/containerd.sock)
#
# Needs: tar, sha256sum, ldd, ctr (import only).
set -euo pipefail

die() { echo "local-images.sh: $*" >&2; exit 1; }

# The docker-archive layout (docker's image spec v1.2 "save" format): manifest.json naming the
# config and the layer tars; the config's rootfs.diff_ids are the layers' sha256. Timestamps and
# owners are fixed, so the same directory always makes the same image id.
rootfs() {
  [ $# -eq 4 ] || die "usage: rootfs DIR NAME:TAG CONFIG_JSON OUT.tar"
  local dir="$1" ref="$2" cfg="$3" out="$4" work diff cid arch
  [ -d "$dir" ] || die "no directory $dir"
  arch="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  tar --numeric-owner --owner=0 --group=0 --sort=name --mtime='2020-01-01 00:00Z' \
    -C "$dir" -cf "$work/layer.tar" .
  diff="$(sha256sum "$work/layer.tar" | cut -d' ' -f1)"
  mkdir "$work/$diff"
  mv "$work/layer.tar" "$work/$diff/layer.tar"
  cat > "$work/config.json" <<EOF
{"architecture":"$arch","os":"linux","created":"2020-01-01T00:00:00Z","config":$cfg,
 "rootfs":{"type":"layers","diff_ids":["sha256:$diff"]},
 "history":[{"created":"2020-01-01T00:00:00Z","created_by":"docker/local-images.sh"}]}
EOF
  cid="$(sha256sum "$work/config.json" | cut -d' ' -f1)"
  mv "$work/config.json" "$work/$cid.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]\n' "$cid" "$ref" "$diff" \
    > "$work/manifest.json"
  tar --numeric-owner --owner=0 --group=0 -C "$work" -cf "$out.tmp" manifest.json "$cid.json" "$diff"
  mv -f "$out.tmp" "$out"
}

libs() {
  [ $# -ge 2 ] || die "usage: libs ROOTFS FILE..."
  local root="$1" f lib
  shift
  for f in "$@"; do
    # ldd prints "name => /path (addr)" for each library and "/lib64/ld-linux... (addr)" for the loader.
    for lib in $(ldd "$f" | awk '/=> \// {print $3} /^\t\// {print $1}'); do
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
  done
}

import() {
  [ $# -ge 1 ] || die "usage: import OUT.tar..."
  local a
  for a in "$@"; do
    ctr --address "${CONTAINERD_ADDRESS:-/run/containerd/containerd.sock}" -n k8s.io images import "$a" >/dev/null
  done
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  rootfs) rootfs "$@" ;;
  libs) libs "$@" ;;
  import) import "$@" ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac
