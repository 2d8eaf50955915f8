#!/usr/bin/env bash
# Build the local Docker image the tests use: no registry is reachable here, so the image is an
# almost empty rootfs that borrows the host's /usr (bind-mounted read-only by the docker
# sandbox when the image is choir-test:host). Idempotent.
set -euo pipefail
IMAGE="${1:-choir-test:host}"
if docker image inspect "$IMAGE" >/dev/null 2>&1; then exit 0; fi
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{usr,etc,tmp,repo,choir/out,proc,sys,dev}
ln -s usr/bin "$root/bin"; ln -s usr/lib "$root/lib"; ln -s usr/sbin "$root/sbin"
[ -e /lib64 ] && ln -s usr/lib64 "$root/lib64"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
chmod 1777 "$root/tmp"
tar -C "$root" -c . | docker import - "$IMAGE" >/dev/null
echo "built $IMAGE"
