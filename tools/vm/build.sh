# shellcheck shell=bash
# Preparation of the soft-RoCE guest image (kernel + initramfs), sourced by
# tools/vm/vm. The image lives in a cache outside the repository so fresh
# clones (CI) reuse it; it is keyed on the Debian kernel package version and on
# a hash of this file and the guest /init, so editing either rebuilds it.
#
# Exit statuses (of rs_vm_build): 0 ready, 2 host packages missing (the exact
# apt-get line is printed), 3 kernel package cannot be fetched, 1 other error.

RS_VM_HOST_PACKAGES="qemu-system-x86 busybox-static cpio kmod iproute2 ibverbs-providers"

# Modules the guest loads by name (see init); their dependency closure is
# computed with modprobe against the extracted kernel so nothing is guessed.
# kernel/net/sched is added whole because loss/QoS experiments pick qdiscs,
# classifiers and actions freely on the two-VM link.
RS_VM_MODULES="crc32_generic crc32-pclmul virtio_pci virtio_net 9pnet_virtio 9p
ib_uverbs ib_umad rdma_ucm rdma_rxe dummy sch_netem"
RS_VM_MODULE_TREES="kernel/net/sched"

rs_vm_note() { printf 'vm: %s\n' "$*" >&2; }

rs_vm_cache_dir() {
    printf '%s\n' "${RDMASOCK_VM_CACHE:-/var/tmp/rdmasock-vm}"
}

# Prints the packages (from RS_VM_HOST_PACKAGES) that are not installed.
rs_vm_missing_packages() {
    local package status missing=()
    for package in $RS_VM_HOST_PACKAGES; do
        status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)
        [[ "$status" == *" installed" ]] || missing+=("$package")
    done
    printf '%s\n' "${missing[*]}"
}

rs_vm_check_host() {
    local missing
    missing=$(rs_vm_missing_packages)
    if [[ -n "$missing" ]]; then
        rs_vm_note "missing host packages; install them with:"
        printf 'apt-get install -y %s\n' "$missing" >&2
        return 2
    fi
    return 0
}

# Sets RS_VM_KPKG (e.g. linux-image-6.1.0-56-amd64) and RS_VM_KPKG_VERSION.
rs_vm_resolve_kernel() {
    RS_VM_KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null |
                 awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
    [[ -n "$RS_VM_KPKG" ]] || return 1
    RS_VM_KPKG_VERSION=$(apt-cache show --no-all-versions "$RS_VM_KPKG" 2>/dev/null |
                         awk '$1 == "Version:" { print $2; exit }')
    [[ -n "$RS_VM_KPKG_VERSION" ]]
}

rs_vm_script_hash() {
    local here
    here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
    cat "$here/build.sh" "$here/init" | sha256sum | cut -c1-12
}

# Newest ready image built by the same scripts, for when apt cannot answer
# (no network, stale lists): a working cached kernel beats no VM at all.
rs_vm_fallback_image() {
    local cache=$1 hash=$2 dir
    dir=$(ls -1td "$cache"/images/*-"$hash" 2>/dev/null | while read -r d; do
              [[ -e "$d/ready" ]] && { echo "$d"; break; }
          done)
    [[ -n "$dir" ]] && printf '%s\n' "$dir"
}

rs_vm_download_kernel() {
    local cache=$1 deb=$2 tmp
    tmp=$(mktemp -d "$cache/.download.XXXXXX") || return 1
    # _apt must be able to write the target folder, or apt warns about an
    # unsandboxed download on every build.
    chown _apt "$tmp" 2>/dev/null
    if ! (cd "$tmp" && apt-get download -qq "$RS_VM_KPKG=$RS_VM_KPKG_VERSION") >/dev/null 2>&1; then
        # Stale package lists point at a version the mirror no longer has.
        apt-get update -qq >/dev/null 2>&1
        if ! rs_vm_resolve_kernel ||
           ! (cd "$tmp" && apt-get download -qq "$RS_VM_KPKG=$RS_VM_KPKG_VERSION") >/dev/null 2>&1; then
            rm -rf "$tmp"
            return 1
        fi
        deb="$cache/debs/${RS_VM_KPKG}_${RS_VM_KPKG_VERSION}_amd64.deb"
    fi
    mkdir -p "$cache/debs"
    mv "$tmp"/*.deb "$deb" && rm -rf "$tmp"
}

# Builds kernel + initramfs for the resolved kernel into image dir $2.
rs_vm_make_image() {
    local deb=$1 image=$2 here work stage kver module path count
    here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
    work=$(mktemp -d "$(dirname "$image")/.work.XXXXXX") || return 1
    stage="$work/stage"

    dpkg -x "$deb" "$work/kernel" || { rm -rf "$work"; return 1; }
    kver=$(ls -1 "$work/kernel/lib/modules" | head -n1)
    [[ -n "$kver" && -e "$work/kernel/boot/vmlinuz-$kver" ]] || {
        rs_vm_note "kernel package has no vmlinuz/modules"; rm -rf "$work"; return 1; }
    depmod -b "$work/kernel" "$kver" || { rm -rf "$work"; return 1; }

    local kmods="$work/kernel/lib/modules/$kver"
    mkdir -p "$stage/bin" "$stage/lib/modules/$kver"
    cp /bin/busybox "$stage/bin/busybox"
    install -m 0755 "$here/init" "$stage/init"

    {
        for module in $RS_VM_MODULES; do echo "$module"; done
        for tree in $RS_VM_MODULE_TREES; do
            find "$kmods/$tree" -name '*.ko' -printf '%f\n' | sed 's/\.ko$//'
        done
    } | sort -u | while read -r module; do
        # -C /dev/null: the host's modprobe.d options must not leak in.
        modprobe -C /dev/null -d "$work/kernel" -S "$kver" --show-depends "$module" \
            2>/dev/null || echo "missing $module"
    done > "$work/modprobe.out"
    if grep -q '^missing' "$work/modprobe.out"; then
        rs_vm_note "modules not found: $(awk '$1 == "missing" { printf "%s ", $2 }' "$work/modprobe.out")"
        rm -rf "$work"
        return 1
    fi
    awk '$1 == "insmod" { print $2 }' "$work/modprobe.out" | sort -u > "$work/modules.list"

    count=0
    while read -r path; do
        mkdir -p "$stage/lib/modules/$kver/$(dirname "${path#"$kmods"/}")"
        cp "$path" "$stage/lib/modules/$kver/${path#"$kmods"/}"
        count=$((count + 1))
    done < "$work/modules.list"
    cp "$kmods"/modules.order "$kmods"/modules.builtin "$kmods"/modules.builtin.modinfo \
        "$stage/lib/modules/$kver/"
    depmod -b "$stage" "$kver" || { rm -rf "$work"; return 1; }

    mkdir -p "$image"
    cp "$work/kernel/boot/vmlinuz-$kver" "$image/vmlinuz"
    (cd "$stage" && find . -print0 | LC_ALL=C sort -z |
        cpio --null -o -H newc --owner=0:0 --quiet) | gzip -6 > "$image/initrd.gz" ||
        { rm -rf "$work"; return 1; }
    printf 'kernel_package=%s\nkernel_package_version=%s\nkernel_release=%s\nmodules=%s\n' \
        "$RS_VM_KPKG" "$RS_VM_KPKG_VERSION" "$kver" "$count" > "$image/info"
    rm -rf "$work"
}

# Old images and kernel packages would pile up in the cache as Debian moves
# the kernel on; anything not used for 14 days goes.
rs_vm_prune_cache() {
    local cache=$1 keep_deb=$2
    find "$cache/images" -mindepth 1 -maxdepth 1 -type d -name 'linux-*' -mtime +14 \
        -exec rm -rf {} + 2>/dev/null
    find "$cache/images" -mindepth 1 -maxdepth 1 -name '.work.*' -mmin +120 \
        -exec rm -rf {} + 2>/dev/null
    find "$cache/debs" -mindepth 1 -maxdepth 1 -name '*.deb' ! -path "$keep_deb" \
        -exec rm -f {} + 2>/dev/null
}

# Ensures a ready image; sets RS_VM_IMAGE (folder with vmlinuz, initrd.gz,
# info). Quiet (one line) when the image is already there.
rs_vm_build() {
    local cache hash key deb image tmpimage started status lockfd
    rs_vm_check_host || return 2
    cache=$(rs_vm_cache_dir)
    mkdir -p "$cache/images" "$cache/debs" || { rs_vm_note "cannot create $cache"; return 1; }
    hash=$(rs_vm_script_hash)

    if ! rs_vm_resolve_kernel; then
        RS_VM_IMAGE=$(rs_vm_fallback_image "$cache" "$hash")
        if [[ -n "$RS_VM_IMAGE" ]]; then
            rs_vm_note "apt cannot resolve linux-image-amd64; using cached $(basename "$RS_VM_IMAGE")"
            return 0
        fi
        rs_vm_note "cannot resolve the kernel package (apt-cache depends linux-image-amd64)"
        return 3
    fi
    key="${RS_VM_KPKG}_${RS_VM_KPKG_VERSION}-${hash}"
    image="$cache/images/$key"
    if [[ -e "$image/ready" ]]; then
        touch "$image"
        RS_VM_IMAGE=$image
        return 0
    fi

    # One builder at a time; a second caller waits and then finds it ready.
    exec {lockfd}>"$cache/lock" || return 1
    if ! flock -w 900 "$lockfd"; then
        rs_vm_note "timed out waiting for the build lock $cache/lock"
        exec {lockfd}>&-
        return 1
    fi
    status=0
    if [[ ! -e "$image/ready" ]]; then
        started=$SECONDS
        rs_vm_note "building the guest image $key (kernel package + initramfs) in $cache"
        deb="$cache/debs/${RS_VM_KPKG}_${RS_VM_KPKG_VERSION}_amd64.deb"
        if [[ ! -s "$deb" ]] && ! rs_vm_download_kernel "$cache" "$deb"; then
            RS_VM_IMAGE=$(rs_vm_fallback_image "$cache" "$hash")
            if [[ -n "$RS_VM_IMAGE" ]]; then
                rs_vm_note "cannot download $RS_VM_KPKG; using cached $(basename "$RS_VM_IMAGE")"
            else
                rs_vm_note "cannot download $RS_VM_KPKG $RS_VM_KPKG_VERSION (apt-get download failed)"
                status=3
            fi
        else
            # The resolution may have moved on during a retried download.
            key="${RS_VM_KPKG}_${RS_VM_KPKG_VERSION}-${hash}"
            image="$cache/images/$key"
            deb="$cache/debs/${RS_VM_KPKG}_${RS_VM_KPKG_VERSION}_amd64.deb"
            # Built aside and renamed, so a reader never sees half an image.
            tmpimage="$cache/images/.work.$key.$$"
            rm -rf "$tmpimage"
            if rs_vm_make_image "$deb" "$tmpimage"; then
                touch "$tmpimage/ready"
                rm -rf "$image"
                mv "$tmpimage" "$image"
                RS_VM_IMAGE=$image
                # shellcheck disable=SC2034 # read by tools/vm/vm
                RS_VM_BUILT=1
                local what
                what=$(awk -F= '$1 == "kernel_release" { k = $2 } $1 == "modules" { m = $2 }
                                END { print "kernel " k ", " m " modules" }' "$image/info")
                rs_vm_note "image ready: $image ($what, initrd $(du -h "$image/initrd.gz" | cut -f1), built in $((SECONDS - started)) s)"
                rs_vm_prune_cache "$cache" "$deb"
            else
                rm -rf "$tmpimage"
                rs_vm_note "image build failed"
                status=1
            fi
        fi
    else
        RS_VM_IMAGE=$image
    fi
    exec {lockfd}>&-
    return $status
}
