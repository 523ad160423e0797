#!/usr/bin/env bash
# The device-path engine bench (crates/fuse-core/benches/device_path.rs,
# the batched rows at 16) of an older commit against this tree, side by
# side: the old commit is checked out in a worktree (its own target
# directory), and each round runs the bench in both, old first, then new.
#   benches/ab-engine.sh OLD_COMMIT [ROUNDS]
# Prints "round R old|new ROW NS" (criterion's median, ns per request).
set -euo pipefail
old=$1 rounds=${2:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
wt=${TMPDIR:-/tmp}/fusebox-ab-engine
git -C "$root" worktree remove --force "$wt" 2>/dev/null || true
git -C "$root" worktree add -q --detach "$wt" "$old"
trap 'git -C "$root" worktree remove --force "$wt"' EXIT
for ((r = 1; r <= rounds; r++)); do
	for who in old new; do
		if [ $who = old ]; then d=$wt t=$root/target/ab-engine-old; else d=$root t=$root/target; fi
		(cd "$d" && CARGO_TARGET_DIR=$t cargo bench -q -p fuse-core --bench device_path -- \
			--warm-up-time 1 --measurement-time 3 '_batched/16' > /dev/null 2>&1)
		for k in getattr_batched read_4k_batched read_4k_copied_batched; do
			printf "round %s %s %s %.0f\n" "$r" $who $k "$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['median']['point_estimate'] / 16)" "$t/criterion/device_path/$k/16/new/estimates.json")"
		done
	done
done
