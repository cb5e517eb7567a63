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
#   docker/local-images.sh images BIN_DIR OUT_DIR [REGISTRY]
#       the four images of docker/Dockerfile from built binaries (BIN_DIR: target/release, or
#       target/debug), same paths, users and entrypoints, as OUT_DIR/<component>.tar named
#       REGISTRY/vgpu/vgpu-<component>:<appVersion> (REGISTRY default: local)
#   docker/local-images.sh kube-scheduler BINARY OUT.tar NAME:TAG
#       the official kube-scheduler binary as the image the chart runs (`kube-scheduler` on PATH)
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
  rm -rf "$work"
}

libs() {
  [ $# -ge 2 ] || die "usage: libs ROOTFS FILE..."
  local root="$1" f lib
  shift
  for f in "$@"; do
    # ldd prints "name => /path (addr)" for each library and "/lib64/ld-linux... (addr)" for the loader.
    for lib in $(ldd "$f" 2>/dev/null | awk '/=> \// {print $3} /^\t\// {print $1}'); do
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

# One image of docker/Dockerfile: component, binary, user ("" = root, as the Dockerfile's
# device-plugin stage), and for the device plugin libvgpu.so, which its init container installs.
component() {
  local bin_dir="$1" out_dir="$2" registry="$3" version="$4" name="$5" user="$6" root cfg
  root="$(mktemp -d)"
  mkdir -p "$root/usr/bin" "$root/tmp"
  chmod 1777 "$root/tmp"
  cp "$bin_dir/vgpu-$name" "$root/usr/bin/vgpu-$name"
  libs "$root" "$root/usr/bin/vgpu-$name"
  if [ "$name" = device-plugin ]; then
    mkdir -p "$root/usr/lib/vgpu"
    cp "$bin_dir/libvgpu.so" "$root/usr/lib/vgpu/libvgpu.so"
    libs "$root" "$root/usr/lib/vgpu/libvgpu.so"
  fi
  cfg="{\"Entrypoint\":[\"/usr/bin/vgpu-$name\"],\"Env\":[\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"]"
  [ -n "$user" ] && cfg="$cfg,\"User\":\"$user\""
  rootfs "$root" "$registry/vgpu/vgpu-$name:$version" "$cfg}" "$out_dir/$name.tar"
  rm -rf "$root"
}

images() {
  [ $# -ge 2 ] || die "usage: images BIN_DIR OUT_DIR [REGISTRY]"
  local bin_dir="$1" out_dir="$2" registry="${3:-local}" version
  version="$(awk '/^appVersion:/ {gsub(/"/, "", $2); print $2}' "$(dirname "$0")/../helm/vgpu/Chart.yaml")"
  [ -n "$version" ] || die "no appVersion in helm/vgpu/Chart.yaml"
  mkdir -p "$out_dir"
  component "$bin_dir" "$out_dir" "$registry" "$version" webhook 65532:65532
  component "$bin_dir" "$out_dir" "$registry" "$version" scheduler 65532:65532
  component "$bin_dir" "$out_dir" "$registry" "$version" certs 65532:65532
  component "$bin_dir" "$out_dir" "$registry" "$version" device-plugin ""
}

kube_scheduler() {
  [ $# -eq 3 ] || die "usage: kube-scheduler BINARY OUT.tar NAME:TAG"
  local root
  root="$(mktemp -d)"
  mkdir -p "$root/usr/local/bin" "$root/tmp"
  chmod 1777 "$root/tmp"
  cp "$1" "$root/usr/local/bin/kube-scheduler"
  libs "$root" "$root/usr/local/bin/kube-scheduler"
  rootfs "$root" "$3" '{"Entrypoint":["/usr/local/bin/kube-scheduler"],"Env":["PATH=/usr/local/bin:/usr/bin:/bin"],"User":"65532:65532"}' "$2"
  rm -rf "$root"
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  rootfs) rootfs "$@" ;;
  libs) libs "$@" ;;
  import) import "$@" ;;
  images) images "$@" ;;
  kube-scheduler) kube_scheduler "$@" ;;
  *) sed -n '2,19p' "$0"; exit 2 ;;
esac
