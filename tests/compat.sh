#!/usr/bin/env bash
# The oldest supported Spark/Delta pair, tested in a venv of its own (docs/deployment.md: Supported versions).
#
#   bash tests/compat.sh                      # pyspark 4.0.1 + delta-spark 4.0.1 (Databricks 17.3 LTS's Spark 4.0)
#   COMPAT_PYSPARK=4.2.0 COMPAT_DELTA=4.4.0 bash tests/compat.sh   # any other pair the same way
#
# The venv gets the core wheel's dependencies, the Connect client's, and the pair; the jar comes
# from materializer/spark/packages.py's table for the installed pyspark (fetched once into the Ivy cache).
# It runs the core scenarios on a local session and on a Spark Connect server started from that
# pyspark's own jars: the pipeline, the txn version against Delta's skipping, one kill mid-MERGE.
set -euo pipefail
cd "$(dirname "$0")/.."
PYSPARK=${COMPAT_PYSPARK:-4.0.1}
DELTA=${COMPAT_DELTA:-4.0.1}
VENV=${COMPAT_VENV:-$HOME/.cache/materializer/venv-pyspark-$PYSPARK}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q -e '.[connect]' "pyspark==$PYSPARK" "delta-spark==$DELTA" "pytest>=8" "hypothesis>=6.100"
"$VENV/bin/python" -c "import pyspark, materializer.spark as s; print('pyspark', pyspark.__version__, '->', s.delta_package())"
# -m: the full run's selection (the quick default one leaves out the `slow` tests named here).
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m "not drill and not long" \
  tests/test_txn_version.py tests/test_connect.py \
  "tests/test_pipeline.py::test_tables_equal_the_oracle_with_one_commit_per_epoch" \
  "tests/test_pipeline.py::test_reapplying_an_applied_epoch_is_skipped_by_delta" \
  "tests/test_pipeline.py::test_new_columns_and_struct_sub_fields_evolve_the_table_and_missing_ones_become_null" \
  "$@"
