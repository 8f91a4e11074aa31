#!/bin/sh
# cargo-skeleton SOURCE DESTINATION
#
# Copies the workspace at SOURCE to DESTINATION as a skeleton: Cargo.lock,
# every manifest, and a stub in place of every target root (libraries, binaries,
# build scripts, tests, benches, examples), as `cargo metadata` lists them.
# Building the skeleton compiles every dependency and none of muster's own
# code, so the Dockerfile can cache that layer: the skeleton's content changes
# only when a manifest, the lock file or the set of targets does.
#
# The packages come from `cargo metadata`, so a new workspace member (such as
# the console) is covered without a change here. Files a crate embeds at
# compile time (include_str!: the services' SQL migrations, the console's
# assets/) are left out: the stubs embed nothing, and the Dockerfile's real
# build copies the whole source tree, those files included.
#
# Needs only `cargo` and POSIX tools (the rust image has no jq or python).
# `.ci/check-deploy` runs it too and checks that the skeleton still resolves
# with `--locked`, so a manifest change cannot break the image's first layer
# unnoticed.
set -eu

if [ "$#" -ne 2 ]; then
    echo "usage: $0 SOURCE DESTINATION" >&2
    exit 2
fi
source_dir=$(cd "$1" && pwd -P)
destination=$2
mkdir -p "$destination"
destination=$(cd "$destination" && pwd -P)

metadata=$(cd "$source_dir" && cargo metadata --no-deps --offline --format-version 1)

stub='#![allow(dead_code, missing_docs)]
fn main() {}'

copy_relative() { # copy SOURCE/$1 to DESTINATION/$1
    mkdir -p "$destination/$(dirname "$1")"
    cp "$source_dir/$1" "$destination/$1"
}

copy_relative Cargo.toml
copy_relative Cargo.lock
# Patched dependencies ([patch.crates-io]) are dependencies: copied whole.
if [ -d "$source_dir/vendor" ]; then
    cp -R "$source_dir/vendor" "$destination/vendor"
fi

# Every path cargo reports is absolute; keep the part under the workspace root.
paths() { # paths KEY: the values of "KEY":"..." in the metadata, relative to the root
    printf '%s\n' "$metadata" | grep -o "\"$1\":\"[^\"]*\"" | sed -e "s/^\"$1\":\"//" -e 's/"$//' |
        while IFS= read -r path; do
            case "$path" in
                "$source_dir"/*) printf '%s\n' "${path#"$source_dir"/}" ;;
                *) echo "cargo-skeleton: $path is outside the workspace $source_dir" >&2; exit 1 ;;
            esac
        done
}

manifests=$(paths manifest_path)
[ -n "$manifests" ] || { echo "cargo-skeleton: cargo metadata listed no package" >&2; exit 1; }
for manifest in $manifests; do
    copy_relative "$manifest"
done

# One line per target: its kind, a space, its source path. Tests, benches and
# examples that cargo discovers by itself need no stub (a missing one is simply
# not discovered), so they get one only when their package's manifest declares
# targets of that kind ([[test]], [[bench]], [[example]]): adding a test file
# then leaves the dependency layer cached.
package_manifest() { # package_manifest TARGET: the manifest of the package that holds TARGET
    directory=$(dirname "$1")
    while [ "$directory" != . ] && [ "$directory" != / ]; do
        if [ -f "$source_dir/$directory/Cargo.toml" ]; then
            printf '%s\n' "$directory/Cargo.toml"
            return
        fi
        directory=$(dirname "$directory")
    done
    printf '%s\n' Cargo.toml
}

printf '%s\n' "$metadata" | grep -o '"kind":\["[a-z-]*"[^]]*\][^{}]*"src_path":"[^"]*"' |
    sed -e 's/^"kind":\["\([a-z-]*\)".*"src_path":"\(.*\)"$/\1 \2/' >"$destination/.targets"
stubs=0
while read -r kind path; do
    case "$path" in
        "$source_dir"/*) path=${path#"$source_dir"/} ;;
        *) echo "cargo-skeleton: $path is outside the workspace $source_dir" >&2; exit 1 ;;
    esac
    case "$kind" in
        test | bench | example)
            grep -q "^[[:space:]]*\[\[$kind\]\]" "$source_dir/$(package_manifest "$path")" || continue ;;
    esac
    mkdir -p "$destination/$(dirname "$path")"
    printf '%s\n' "$stub" >"$destination/$path"
    stubs=$((stubs + 1))
done <"$destination/.targets"
rm "$destination/.targets"
[ "$stubs" -gt 0 ] || { echo "cargo-skeleton: cargo metadata listed no target" >&2; exit 1; }
