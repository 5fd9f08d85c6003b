# shellcheck shell=bash
# Sourced by the A/B scripts (decode_ab.sh, train_ab.sh) after gpu_env.sh: ab_variant LABEL=WORDS
# splits one variant's argument into `label`, `envs` (VAR=VALUE words, set for its runs), `opts`
# (the rest: options of `kernel-hub demo`) and `bin` (BIN=PATH: another build's kernel-hub;
# default the bundle's). HUB=DIR stands for another build's packages: their default hub and key in
# DIR (default-hub/, default-hub-key/), with a cache and trust store of the variant's own (an
# older signed index is refused as a rollback where a newer one was seen).
# shellcheck disable=SC2034  # label, envs, opts and bin are the caller's
ab_variant() {
  label=${1%%=*}
  local words=${1#*=} w
  envs=(); opts=(); bin=${g:?gpu_env.sh first}/bin/kernel-hub
  if [[ $1 != *=* || -z $label ]]; then
    echo "ab_variant: '$1' is not LABEL=WORDS" >&2
    return 1
  fi
  for w in $words; do
    if [[ $w == BIN=* ]]; then bin=${w#BIN=}
    elif [[ $w == HUB=* ]]; then
      envs+=("KERNEL_HUB_DATA_DIR=${w#HUB=}" "KERNEL_HUB_CACHE=/tmp/kh-cache-ab-$label"
             "KERNEL_HUB_TRUST_DIR=/tmp/kh-trust-ab-$label")
    elif [[ $w == [A-Z_]*=* ]]; then envs+=("$w")
    else opts+=("$w"); fi
  done
}
