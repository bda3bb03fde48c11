#!/usr/bin/env bash
# Measures the torture checker's power (issue 20): for each mutant under
# internal/torture/mutants (a patch that re-introduces one defect; or the
# patches named as arguments), copies the working tree to a temporary
# directory, applies the patch there, runs the torture test for DURATION
# with SEED, and says whether the checker found an anomaly, how long the
# run took and when the history became illegal. The tree itself is
# never changed. make mutants runs it. A file NAME.flags next to a
# patch holds extra torture flags for that mutant (the condition its
# defect needs, e.g. -torture.dsn-tz=+05:00). Each run writes a JSON
# summary (internal/torture.Summary: found or not, when the history became
# illegal) to $SUMMARY_DIR/mutant-NAME.json (default: the outputs'
# directory); SUMMARY_DIR=docs/verification records them for make
# verification.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
duration=${DURATION:-2m}
seed=${SEED:-3}
go=${GO:-go}
if [ $# -eq 0 ]; then
	set -- "$root"/internal/torture/mutants/*.patch
fi
# Each failing run's output, history and porcupine views go to $out.
out=${MUTANTS_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/dsync-mutants.XXXXXX")}
mkdir -p "$out"
echo "outputs and histories in $out"
summaries=${SUMMARY_DIR:-$out}
mkdir -p "$summaries"
summaries=$(cd "$summaries" && pwd)
status=0
for patch in "$@"; do
	name=$(basename "$patch" .patch)
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsync-mutant-$name.XXXXXX")
	(cd "$root" && git ls-files -co --exclude-standard -z | tar --null -cf - -T -) | tar -xf - -C "$tmp"
	summary="$summaries/mutant-$name.json"
	if ! patch -s -d "$tmp" -p1 <"$patch"; then
		echo "$name: the patch does not apply (refresh it against the current tree)"
		printf '{"mutant": "%s", "target": "server", "error": "the patch does not apply"}\n' "$name" >"$summary"
		rm -rf "$tmp"
		status=1
		continue
	fi
	flags=()
	if [ -f "${patch%.patch}.flags" ]; then
		read -r -a flags <"${patch%.patch}.flags"
	fi
	start=$(date +%s)
	(cd "$tmp" && $go test -race -count=1 -timeout 0 -run '^TestTorture$' -v ./internal/torture/ \
		-torture.duration="$duration" -torture.seed="$seed" -torture.out="$out/mutant-$name" \
		-torture.summary="$summary" -torture.mutant="$name" ${flags[@]+"${flags[@]}"}) >"$tmp/out.txt" 2>&1
	rc=$?
	took=$(($(date +%s) - start))
	if grep -q 'anomalies (rerun' "$tmp/out.txt"; then
		first=$(grep -o 'first anomaly at [0-9.]*s' "$tmp/out.txt" | head -1)
		locks=$(grep -oE "^ *lock \"[^\"]*\": [A-Za-z]*" "$tmp/out.txt" | sed "s/^ *//" | sort -u | tr '\n' ' ')
		echo "$name: FOUND (seed $seed, run of $duration took ${took}s, $first; $locks; $out/mutant-$name.txt)"
		cp "$tmp/out.txt" "$out/mutant-$name.txt"
	elif [ $rc -eq 0 ]; then
		echo "$name: not found (seed $seed, run of $duration took ${took}s)"
		status=1
	else
		echo "$name: the run failed without an anomaly (exit $rc):"
		printf '{"mutant": "%s", "target": "server", "seed": %s, "error": "the run failed without an anomaly (exit %s)"}\n' "$name" "$seed" "$rc" >"$summary"
		tail -20 "$tmp/out.txt"
		status=1
	fi
	rm -rf "$tmp"
done
exit $status
