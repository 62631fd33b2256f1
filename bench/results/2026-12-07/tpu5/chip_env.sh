# What every chip call of this (sixth) session ran first (inline in each call's script then; sourced
# here): the project's wheels into a site folder once, the checkout on the path, quiet logs.
site=/tmp/lingvo_lite_site
if [ ! -e $site/.installed ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target $site .whl-tpu/*.whl && touch $site/.installed
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:$site" PYTHONUNBUFFERED=1
clean() { grep -v "^[WI]0\|^E1207\|symbolize\|hugepages\|warnings.warn"; }
