set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
MEGAKERNEL_TEST_CHECKPOINT=/tmp/nmc-5l timeout 250 python3 -m pytest -q -rA -p no:cacheprovider -s \
  tests/gpu/test_megakernel_step.py -k every_row_at_8k > $OUT/diag.txt 2>&1
echo rc=$?; grep -E "^(PASSED|FAILED)|min cosine|^E .*(cosine|err)" $OUT/diag.txt | cut -c1-300 | head -30; tail -1 $OUT/diag.txt
