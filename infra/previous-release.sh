#!/usr/bin/env bash
# The previous release's five function bootstraps, built from the commit `infra/previous-release`
# names (`<tag> <commit>`), into .local/previous/<tag>/; prints that folder. The upgrade test
# (tests/tests/it/lambda/upgrade.rs) deploys them, then this build's, one function at a time, and
# back. Built once: a folder that has the five is used as it is.
#
# The commit's tree is taken with `git archive` (no checkout of this one changes) and built with
# this workspace's target directory, so the dependencies already compiled here are reused and
# only the project's own crates of that commit are compiled (the same Cargo.lock but for their
# versions). It leaves no bootstrap in target/debug: build this one after it
# (`cargo build --workspace --bins`, as test-lambda.sh and CI do), which puts this build's back.
set -euo pipefail
# shellcheck source=infra/env.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"
cd "$SAS_ROOT"

read -r tag commit <infra/previous-release
out="$SAS_LOCAL_DIR/previous/$tag"
bins=(sas-submitter sas-scheduler sas-agent sas-supervisor sas-callback)
have=0
for b in "${bins[@]}"; do [ -x "$out/$b" ] && have=$((have + 1)); done
if [ "$have" = "${#bins[@]}" ]; then
  echo "$out"
  exit 0
fi

if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  # a shallow clone: ask the repository it was cloned from for the history
  echo "[previous-release] $commit ($tag) is not in this clone: fetching it" >&2
  git fetch -q --tags origin >&2 2>/dev/null || true
  git fetch -q --unshallow origin >&2 2>/dev/null || true
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "[previous-release] error: commit $commit ($tag) is not in this repository, nor could it be fetched" >&2
  exit 1
fi

src="$SAS_LOCAL_DIR/previous/src-$tag"
rm -rf "$src" "$out.partial"
mkdir -p "$src" "$out.partial"
git archive "$commit" | tar -x -C "$src"
target="${CARGO_TARGET_DIR:-$SAS_ROOT/target}"
started=$SECONDS
echo "[previous-release] cargo build --workspace --bins of $tag ($commit), target $target" >&2
# Cargo links a bootstrap into target/debug when it builds it, or when it is missing there: the
# five are removed before (so that they are that commit's, built or not) and after (so that the
# next build of this workspace links its own again, built or not).
for b in "${bins[@]}"; do rm -f "$target/debug/$b"; done
(cd "$src" && CARGO_TARGET_DIR="$target" cargo build -q --workspace --bins) >&2
for b in "${bins[@]}"; do cp "$target/debug/$b" "$out.partial/$b" && rm -f "$target/debug/$b"; done
rm -rf "$src" "$out"
mv "$out.partial" "$out"
echo "[previous-release] $tag's functions built in $((SECONDS - started)) s: $out" >&2
echo "$out"
