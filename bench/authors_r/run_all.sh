#!/bin/sh
# Run the authors' batch methods over data sets and splits, one R process at a time, one BLAS thread.
#
#   AUTHORS_R_DIR=/path/to/scalable_multiclass_ep sh run_all.sh DATA_ROOT "glass wine" "1 2 3" "ep sep gfitc vi"
#
# DATA_ROOT holds one folder per data set written by export_splits.py.  Records are appended to
# records/<data set>.jsonl beside this script; a (method, split) already there is skipped, so the
# script resumes where it stopped.  The splits loop outside the data sets, so that a run cut short
# still covers every data set.  The authors' log of each fit goes to logs/.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$1; sets=$2; splits=$3; methods=${4:-"ep sep gfitc vi"}
: "${AUTHORS_R_DIR:?set AUTHORS_R_DIR to a checkout of emakryo/scalable_multiclass_ep}"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$here/records" "$here/logs"
for j in $splits; do
  for name in $sets; do
    for method in $methods; do
      rec="$here/records/$name.jsonl"
      if [ -f "$rec" ] && grep -q "\"method\": \"$method\", \"split\": $j," "$rec"; then continue; fi
      nice -n 19 Rscript "$here/run_split.R" "$method" "$root/$name" "$j" "$rec" \
        > "$here/logs/$name-$method-$j.log" 2>&1 || echo "failed: $name $method $j" >&2
    done
  done
done
