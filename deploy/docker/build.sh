#!/usr/bin/env bash
# Build the CPU image (deploy/docker/Dockerfile.cpu) with podman, or buildah where podman
# is missing, and print its name and size. `make images` runs this.
#
#   deploy/docker/build.sh [--base IMAGE] [--tag NAME] [--check]
#
# --base IMAGE  the base image (BASE_IMAGE in the environment does the same). Without one,
#               a Debian bookworm base with python3 is made with mmdebstrap from Debian's
#               packages (localhost/gradpress-base:bookworm, kept for the next build), so
#               the build needs no registry but the Python and Debian package indexes.
# --tag NAME    the image's name (IMAGE; default gradpress-cpu:0.1.0, what the manifests run).
# --check       check the tools and the base image, build nothing.
#
# torch comes from PyTorch's CPU index (the Dockerfile's default) unless a local directory
# of wheels holds the pinned CPU build: TORCH_WHEELS, else pip's own find-links
# (PIP_FIND_LINKS or its config), as on this project's CI machines, which reach no other
# index. That directory is mounted into the build, not copied into a layer; so is the CA
# bundle the host's pip is told to trust (PIP_CA, else pip's `cert` setting).
#
# Exit status: 0 built (or checked), 2 a bad argument or a missing tool or base, else
# the build tool's.
set -euo pipefail

here=$(cd "${BASH_SOURCE[0]%/*}" && pwd)
repo=${here%/deploy/docker}
base=${BASE_IMAGE:-}
image=${IMAGE:-gradpress-cpu:0.1.0}
offline_base=localhost/gradpress-base:bookworm
check_only=

die() { echo "build.sh: $*" >&2; exit 2; }

while (($#)); do
    case $1 in
        --base) base=${2:?--base needs an image name}; shift 2 ;;
        --tag) image=${2:?--tag needs an image name}; shift 2 ;;
        --check) check_only=1; shift ;;
        *) die "unknown argument '$1' (expected --base IMAGE, --tag NAME, --check)" ;;
    esac
done

# An image reference: [registry[:port]/]path[:tag][@sha256:digest], path lower case.
component='[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*'
reference="^([A-Za-z0-9.-]+(:[0-9]+)?/)?${component}(/${component})*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
for name in ${base:+"$base"} "$image"; do
    [[ $name =~ $reference ]] || die "'$name' is not a valid image name (expected e.g. python:3.11-slim or registry.example.org/ml/gradpress-cpu:0.1.0)"
done

if command -v podman >/dev/null; then
    tool=podman
elif command -v buildah >/dev/null; then
    tool=buildah
else
    die "neither podman nor buildah is installed: install one (Debian: apt-get install podman runc)"
fi
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}

image_exists() {
    if [[ $tool == podman ]]; then podman image exists "$1"; else buildah inspect --type image "$1" >/dev/null 2>&1; fi
}

if [[ -n $base ]]; then
    # Stop before building: a base that is neither here nor pullable fails the build anyway.
    if ! image_exists "$base"; then
        echo "build.sh: base image $base is not here; pulling it" >&2
        out=$($tool pull "$base" 2>&1) || die "base image '$base' is not here and cannot be pulled:
$out
Leave --base (BASE_IMAGE) unset to build on a Debian base made with mmdebstrap."
    fi
elif ! image_exists "$offline_base"; then
    command -v mmdebstrap >/dev/null || die "no --base given and mmdebstrap is missing to make one (apt-get install mmdebstrap), or give --base IMAGE"
fi
[[ -n $check_only ]] && { echo "build.sh: $tool, base ${base:-$offline_base}, image $image: ok"; exit 0; }

if [[ -z $base ]]; then
    base=$offline_base
    if ! image_exists "$base"; then
        echo "build.sh: making the base image $base with mmdebstrap (Debian bookworm, python3)"
        tmp=$(mktemp -d)
        trap 'rm -rf "$tmp"' EXIT
        # minbase: dpkg, apt and what python3 needs; python3-venv for `python3 -m venv`.
        mmdebstrap --quiet --variant=minbase --include=python3,python3-venv bookworm "$tmp/rootfs.tar"
        if [[ $tool == podman ]]; then
            podman import --quiet "$tmp/rootfs.tar" "$base" >/dev/null
        else
            ctr=$(buildah from scratch)
            buildah add --quiet "$ctr" "$tmp/rootfs.tar" / >/dev/null
            buildah commit --quiet "$ctr" "$base" >/dev/null
            buildah rm "$ctr" >/dev/null
        fi
    fi
fi

# What the host's pip is set up with, from its environment or config files.
pip_setting() {
    python3 -m pip config list 2>/dev/null | sed -n "s/^[^.]*\.$1='\(.*\)'\$/\1/p" | head -n1
}

torch_version=$(sed -n 's/^ARG TORCH_VERSION=//p' "$here/Dockerfile.cpu")
pip_args=()
for wheels in ${TORCH_WHEELS:-$(pip_setting find-links)}; do
    if [[ -d $wheels ]] && compgen -G "$wheels/torch-$torch_version+cpu-*.whl" >/dev/null; then
        echo "build.sh: torch $torch_version (CPU) from $wheels, the rest from pip's default index"
        pip_args=(--volume "$wheels:/wheels:ro" --build-arg TORCH_INDEX= --build-arg TORCH_FIND_LINKS=/wheels)
        break
    fi
done
# A host whose traffic passes a TLS-inspecting proxy gives pip that proxy's CA bundle;
# the build's pip needs it too.
ca=${PIP_CA:-$(pip_setting cert)}
if [[ -f $ca ]]; then
    echo "build.sh: pip in the build trusts $ca, as the host's pip does"
    pip_args+=(--volume "$ca:/etc/pip-ca.pem:ro" --build-arg PIP_CERT=/etc/pip-ca.pem)
fi

build=(build)
[[ $tool == buildah ]] && build=(bud)
echo "build.sh: building $image from $base with $tool"
# Host networking: pip reaches its index through the host's network, whatever
# container networks are (or are not) set up.
$tool "${build[@]}" --network host --layers -f "$here/Dockerfile.cpu" --ignorefile "$here/Dockerfile.cpu.dockerignore" \
    --build-arg BASE_IMAGE="$base" "${pip_args[@]}" -t "$image" "$repo"

if [[ $tool == buildah ]]; then
    size=$(buildah images --format '{{.Size}}' --filter reference="$image" | head -n1)
else
    size=$(podman image inspect --format '{{.Size}}' "$image")
    size="$((size / 1000000)) MB"
fi
echo "image $image: $size (built with $tool on $base)"
