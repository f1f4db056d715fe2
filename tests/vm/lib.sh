# shellcheck shell=bash disable=SC2154 # cache, root, work and repo are the caller's
# Helpers of tests/vm/run-tests (sourced): Debian's tools and kernel, the initramfs, the scratch
# disk, the boot, and the reading of the console afterwards. They use the caller's variables
# cache, root, work and repo, and set kernel_pkg, kernel_version, vmlinuz and moddir.

say() { echo "== vm: $*"; }
die() { echo "vm: $*" >&2; exit 1; }

# --- Debian's tools ----------------------------------------------------------------------------
# Installs from Debian what the host lacks to build the VM and what the VM runs.
vm_install_tools() {
    local missing=()
    command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
    [[ -x /bin/busybox ]] && file -L /bin/busybox | grep -q 'statically linked' || missing+=(busybox-static)
    command -v cpio >/dev/null || missing+=(cpio)
    [[ -x /usr/sbin/mkfs.xfs && -x /usr/sbin/xfs_quota ]] || missing+=(xfsprogs)
    [[ -x /usr/sbin/mke2fs || -x /sbin/mke2fs ]] || missing+=(e2fsprogs)
    [[ -x /usr/sbin/mkfs.btrfs || -x /sbin/mkfs.btrfs ]] || missing+=(btrfs-progs)
    command -v strip >/dev/null || missing+=(binutils)
    [[ -x /usr/sbin/cryptsetup || -x /sbin/cryptsetup ]] || missing+=(cryptsetup-bin)
    command -v jq >/dev/null || missing+=(jq)
    command -v file >/dev/null || missing+=(file)
    [[ -f /etc/ssl/certs/ca-certificates.crt ]] || missing+=(ca-certificates)
    if ((${#missing[@]})); then
        say "installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
    fi
}

# --- Debian's kernel ---------------------------------------------------------------------------
# Downloads (once, into $cache) and unpacks the exact package linux-image-amd64 depends on (a
# glob would download every kernel).
vm_kernel() {
    kernel_pkg=$(apt-cache depends linux-image-amd64 |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
    [[ -n $kernel_pkg ]] || die "apt-cache depends linux-image-amd64 names no kernel package"
    kernel_version=${kernel_pkg#linux-image-}
    mkdir -p "$cache"
    local deb
    deb=$(find "$cache" -maxdepth 1 -name "${kernel_pkg}_*.deb" | sort | tail -n 1)
    if [[ -z $deb ]]; then
        say "downloading $kernel_pkg into $cache"
        # apt's download user cannot write a root-only cache dir: download as root, quietly.
        (cd "$cache" && apt-get download -o APT::Sandbox::User=root "$kernel_pkg")
        deb=$(find "$cache" -maxdepth 1 -name "${kernel_pkg}_*.deb" | sort | tail -n 1)
        [[ -n $deb ]] || die "apt-get download $kernel_pkg left no .deb in $cache"
    fi
    local kernel_root
    kernel_root=$cache/$(basename "$deb" .deb)
    if [[ ! -f $kernel_root/.complete ]]; then
        say "unpacking $(basename "$deb")"
        rm -rf "$kernel_root"
        mkdir -p "$kernel_root"
        dpkg-deb -x "$deb" "$kernel_root"
        # The package leaves modules.dep to depmod (kmod) at install; busybox's depmod makes it.
        busybox depmod -b "$kernel_root" "$kernel_version"
        touch "$kernel_root/.complete"
    fi
    vmlinuz=$kernel_root/boot/vmlinuz-$kernel_version
    moddir=$kernel_root/lib/modules/$kernel_version
    grep -qx 'CONFIG_XFS_QUOTA=y' "$kernel_root/boot/config-$kernel_version" ||
        die "$kernel_pkg has no CONFIG_XFS_QUOTA=y"
}

# --- the initramfs -----------------------------------------------------------------------------
# $1 copied into the image at the same path, with the libraries it loads.
copy_with_libs() {
    local src=$1 dest=$root$1
    mkdir -p "$(dirname "$dest")"
    cp -L "$src" "$dest"
    local lib
    for lib in $(ldd "$src" 2>/dev/null | grep -oE '/[^ ]+' || true); do
        if [[ ! -e $root$lib ]]; then
            mkdir -p "$(dirname "$root$lib")"
            cp -L "$lib" "$root$lib"
        fi
    done
}

# An executable from the host, found where Debian puts it.
tool() {
    local dir
    for dir in /usr/sbin /sbin /usr/bin /bin; do
        if [[ -x $dir/$1 ]]; then
            copy_with_libs "$dir/$1"
            return
        fi
    done
    die "$1 is not installed"
}

# Busybox for everything else, and the programs the tests and the driver run whose busybox
# applets lack the options they use (found first in PATH: /usr/sbin, /usr/bin).
vm_tools() {
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,var/tmp,lib64,scratch}
    cp /bin/busybox "$root/bin/busybox"
    local applet t
    for applet in $(/bin/busybox --list); do
        [[ -e $root/bin/$applet ]] || ln -s busybox "$root/bin/$applet"
    done
    ln -s ../bin/busybox "$root/sbin/modprobe"
    # Debian's sh, dash, for the tests' `sh -c` (busybox's sh runs its own applets before PATH's
    # programs: its tar and losetup, not GNU's and util-linux's); /init keeps busybox's.
    tool dash
    ln -s dash "$root/usr/bin/sh"
    # util-linux (losetup --find --show, mount -o, umount -l, unshare --propagation, setpriv),
    # xfsprogs, e2fsprogs, btrfs-progs, cryptsetup, and GNU cp (--reflink), du (-B1) and tar
    # (--xattrs).
    for t in mount umount losetup unshare setpriv nsenter mkfs.xfs xfs_quota xfs_growfs xfs_repair \
        mke2fs mkfs.ext4 tune2fs dumpe2fs chattr lsattr resize2fs e2fsck mkfs.btrfs btrfs \
        cryptsetup cp du tar; do
        tool "$t"
    done
    cp /etc/mke2fs.conf "$root/etc/"
    # The driver's Kubernetes client (rustls) wants the system's CA certificates, even for the
    # plain-http stub API servers of the tests.
    mkdir -p "$root/etc/ssl/certs"
    cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
    printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' \
        >"$root/etc/passwd"
    printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$root/etc/group"
}

# Kernel modules $@ (names as modinfo gives them) and everything modules.dep says they need,
# into the image, their load order in /etc/modules-load.
vm_modules() {
    local -A have=()
    local load_order=() m rel
    add_module() {
        local rel=$1 dep
        [[ -n ${have[$rel]:-} ]] && return
        have[$rel]=1
        while read -r dep; do
            add_module "$dep"
        done < <(awk -v m="$rel:" '$1 == m { for (i = 2; i <= NF; i++) print $i }' "$moddir/modules.dep")
        mkdir -p "$(dirname "$root/lib/modules/$kernel_version/$rel")"
        cp "$moddir/$rel" "$root/lib/modules/$kernel_version/$rel"
        load_order+=("$rel")
    }
    for m in "$@"; do
        rel=$(awk -v m="$m" '{ f = $1; sub(":$", "", f); n = f; sub(".*/", "", n); sub("\\.ko.*$", "", n);
            gsub("-", "_", n); mm = m; gsub("-", "_", mm); if (n == mm) { print f; exit } }' "$moddir/modules.dep")
        [[ -n $rel ]] || die "module $m is not in $kernel_pkg"
        add_module "$rel"
    done
    busybox depmod -b "$root" "$kernel_version"
    printf '%s\n' "${load_order[@]}" >"$root/etc/modules-load"
}

# The repository's files (those git knows, as they are in the working tree) at its path: tests
# read the sources, manifests and docs through CARGO_MANIFEST_DIR.
vm_sources() {
    mkdir -p "$root$repo"
    (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done |
        cpio --null -pdm --quiet "$root$repo")
}

# The initramfs $work/initramfs.cpio from $root.
vm_pack() {
    (cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) >"$work/initramfs.cpio"
}

# --- the scratch disk --------------------------------------------------------------------------
# A fresh sparse image of $1 GiB formatted ext4 as a host's disk would be: the VM mounts it on
# /tmp and /var/tmp (loop devices with direct I/O, which a tmpfs of this kernel refuses; and
# scratch pools that do not eat the VM's RAM). qemu passes the VM's discards on as holes. One
# inode per 4 KiB (4 Mi on 16 GiB): hostile_tenant's cases, side by side, make some 1.5 million
# names (400,000 in one directory and its copy, an import of 262,144 files and their spare
# names), past the 1 Mi of ext4's default ratio on this size.
vm_disk() {
    local disk=$work/scratch.img
    rm -f "$disk"
    truncate -s "${1}G" "$disk"
    mkfs.ext4 -q -F -L vm-scratch -i 4096 -E nodiscard,lazy_itable_init=1,lazy_journal_init=1 "$disk"
}

# --- the boot ----------------------------------------------------------------------------------
# Boots the VM: $1 timeout (s), $2 memory (MiB), $3 CPUs; the console to stdout and
# $work/console.log. Sets qemu_rc.
vm_boot() {
    local timeout_s=$1 memory=$2 cpus=$3 accel=tcg cpu=max time_scale=20
    # Not /dev/kvm alone: these machines have one, but without vmx/svm a guest hangs in its
    # kernel's decompressor.
    if grep -qE '\b(vmx|svm)\b' /proc/cpuinfo && [[ -w /dev/kvm ]]; then
        accel=kvm
        cpu=host
        time_scale=1
    fi
    say "booting $kernel_pkg (accel $accel, $cpus CPUs, $memory MiB, timeout $timeout_s s)"
    set +e
    timeout --kill-after=10 "$timeout_s" qemu-system-x86_64 \
        -accel "$accel" -cpu "$cpu" -smp "$cpus" -m "$memory" \
        -kernel "$vmlinuz" -initrd "$work/initramfs.cpio" \
        -append "console=ttyS0 panic=-1 loglevel=4 rdinit=/init stickyvol.time_scale=$time_scale" \
        -drive "file=$work/scratch.img,format=raw,if=virtio,cache=unsafe,discard=unmap" \
        -nographic -no-reboot -nic none -monitor none -serial stdio </dev/null |
        tee "$work/console.log"
    # shellcheck disable=SC2034 # the caller's
    qemu_rc=${PIPESTATUS[0]}
    set -e
}

# --- the console, read ---------------------------------------------------------------------------
# Everything below reads only the console log, so a log can be read again (run-tests --report).
# The VM's lines are matched anywhere in a console line: the firmware's escapes may precede one.

# One line per test binary the VM ran, from console $1: name, exit code, seconds, and libtest's
# passed, failed and ignored counts (its "test result:" line; 0 0 0 when it printed none).
vm_binaries() {
    tr -d '\r' <"$1" | awk '
        match($0, /STICKYVOL-VM: running /) { p = f = i = 0 }
        match($0, /test result: [A-Za-z]+\. [0-9]+ passed; [0-9]+ failed; [0-9]+ ignored/) {
            split(substr($0, RSTART, RLENGTH), w, /[ .;]+/)
            p += w[4]; f += w[6]; i += w[8]
        }
        match($0, /STICKYVOL-VM-TEST [^ ]+ rc=[0-9]+ seconds=[0-9]+/) {
            split(substr($0, RSTART, RLENGTH), w, /[ =]/)
            printf "%s\t%s\t%s\t%d\t%d\t%d\n", w[2], w[4], w[6], p, f, i
        }'
}

# The value of KEY $3 in the last line of console $1 holding tag $2 ("TAG ... KEY=value ...").
vm_console_value() {
    tr -d '\r' <"$1" | grep -aoE "$2 .*" | tail -n 1 | grep -oE "(^| )$3=[^ ]*" | cut -d= -f2- || true
}

# Reads console $1: prints the per-binary table (also into binaries.tsv beside it) and the
# STICKYVOL-VM-SUMMARY line, appends the TSV row to file $2 when given. Returns 0 only when the
# VM ran every binary it meant to, all passed and none skipped.
vm_report() {
    local console=$1 results=${2:-} kernel cgroup skips seconds planned commit result part
    local ran passed failed ignored broken table
    table=$(dirname "$console")/binaries.tsv
    vm_binaries "$console" >"$table"
    printf '%-28s %4s %7s %7s %7s %7s\n' binary rc seconds passed failed ignored
    awk -F'\t' '{ printf "%-28s %4s %7s %7s %7s %7s\n", $1, $2, $3, $4, $5, $6 }' "$table"
    kernel=$(vm_console_value "$console" STICKYVOL-VM-INFO kernel)
    cgroup=$(vm_console_value "$console" STICKYVOL-VM-INFO cgroup)
    commit=$(vm_console_value "$console" STICKYVOL-VM-INFO commit)
    planned=$(vm_console_value "$console" STICKYVOL-VM-INFO binaries)
    part=$(vm_console_value "$console" STICKYVOL-VM-INFO part)
    skips=$(vm_console_value "$console" STICKYVOL-VM-RESULT skips)
    seconds=$(vm_console_value "$console" STICKYVOL-VM-RESULT seconds)
    result=$(tr -d '\r' <"$console" | grep -aoE 'STICKYVOL-VM-RESULT (pass|fail)' | tail -n 1 | cut -d' ' -f2 || true)
    read -r ran passed failed ignored broken < <(awk -F'\t' '
        { n++; p += $4; f += $5; i += $6; if ($2 != 0 && $5 == 0) b++ }
        END { printf "%d %d %d %d %d\n", n, p, f, i, b }' "$table")
    # Binaries the VM never reached (it stopped, or ran out of time) count as broken.
    if ((${planned:-0} > ran)); then
        broken=$((broken + planned - ran))
    fi
    # Without the VM's own count (a VM that never finished): the binaries' seconds, summed.
    [[ -n $seconds ]] || seconds=$(awk -F'\t' '{ s += $3 } END { print s + 0 }' "$table")
    [[ $result == pass && $broken == 0 ]] || result=fail
    echo "STICKYVOL-VM-SUMMARY kernel=${kernel:-unknown} cgroup=${cgroup:-unknown}" \
        "binaries=${planned:-unknown} passed=$passed failed=$failed ignored=$ignored broken=$broken" \
        "skips=${skips:-unknown} seconds=$seconds result=$result"
    if [[ -n $results ]]; then
        # A row of docs/compatibility/vm-runs.tsv's shape, put in by tests/e2e/lib/compat_table.py
        # (the row of the same kernel, cgroup version and part replaced).
        [[ -s $results ]] ||
            printf 'date\tcommit\tkernel\tcgroup\tpart\tbinaries run\tpassed\tfailed\tignored\tminutes\n' >"$results"
        python3 "$repo/tests/e2e/lib/compat_table.py" add "$results" "$(printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s' \
            "$(date -u -r "$console" +%F)" "${commit:-unknown}" "${kernel:-unknown}" "${cgroup:-unknown}" \
            "${part:-unknown}" "$ran of ${planned:-unknown}" "$passed" "$failed" "$ignored" \
            "$(awk -v s="$seconds" 'BEGIN { printf "%.0f", s / 60 }')")"
        say "results put in $results"
    fi
    [[ $result == pass ]]
}
