#!/usr/bin/env bash
# The committed demo model (examples/demo-model/kjv.gguf) writes recognisable text: most words it
# generates from three prompts are words of the King James Bible (a list of its common words), and
# the same check fails on a random-weight model of the same shape — so the check can fail.
# Usage: demo_model_test.sh TESSERA_BINARY MODEL.gguf
set -u
TESSERA=${1:?usage: demo_model_test.sh TESSERA_BINARY MODEL.gguf}
MODEL=${2:?usage: demo_model_test.sh TESSERA_BINARY MODEL.gguf}
[[ -f "$MODEL" ]] || { echo "demo model test: $MODEL is missing"; exit 1; }
DIR=$(mktemp -d /tmp/tessera-demo-model.XXXXXX) || exit 1
trap 'rm -rf "$DIR"' EXIT

generate() {  # generate MODEL OUT: three prompts, sampled as the demo does
  local k=0 p
  for p in "And God said" "In the beginning" "The LORD is my"; do
    k=$((k + 1))
    "$TESSERA" run "$1" -p "$p" -n 48 --temp 0.5 --repeat-penalty 1.1 --seed "$k" --threads 1 \
      2>/dev/null || return 1
    echo
  done >"$2"
}
generate "$MODEL" "$DIR/trained.txt" || { echo "tessera run failed on $MODEL"; exit 1; }
"$TESSERA" model synth --dim 192 --layers 4 --heads 6 --kv-heads 2 --ffn 512 --vocab 512 \
  --context 256 --tied --type f16 -o "$DIR/random.gguf" >/dev/null 2>&1 || { echo "synth failed"; exit 1; }
generate "$DIR/random.gguf" "$DIR/random.txt" || { echo "tessera run failed on the random model"; exit 1; }

/usr/bin/python3 - "$DIR/trained.txt" "$DIR/random.txt" <<'PYEOF'
import re, sys
common = set("""
a about above after again against all also am among an and angel answered any are ark art as at
away be bear because become been before begat behold being beloved besought between blessed blood
body born both bread brethren bring brought but by called came camp can captain cast cattle chief
children christ city come cometh commanded congregation could covenant cried daughter daughters
david day days dead death did die do doth down dwell earth egypt elders else end enemies even ever
every evil eyes face faith father fathers fear field fire first flesh for forth found from gave
gather get give given glory go god gods goeth gold gone good gospel grace great ground had hand
hands hast hath have he head hear heard heart heaven heavens her him himself his holy hosts house
how i if in inherit into is israel it jacob jerusalem jesus jordan joseph judah judge king kingdom
kings know knew land law lay lest let life light like live lo lord love made make man many may me
men might mighty mine moses mount mouth my name nations neither nor not now o of offer offering
offerings on one only or other our out over own peace people place pray priest priests prophet put
said saith sake saul saw say saying see seed send sent servant servants set seven shall she should
shew sight silver sin sins so son sons soul spake speak spirit stood such take temple than that the
thee their them then there therefore these they thine thing things this those thou though three
through thus thy time to together took tree tribe truth turned two unto up upon us was water waters
way ways we were what when whence where wherefore which while who whom whose why wicked wife will
wilderness with within without woman word words work works world would ye yea year years yet you
young your
""".split())

def score(path):
    words = re.findall(r"[a-z]+", open(path, encoding="utf-8", errors="replace").read().lower())
    hits = sum(1 for w in words if w in common)
    return hits / max(1, len(words)), len(words)

trained, n_t = score(sys.argv[1])
rand, n_r = score(sys.argv[2])
print(open(sys.argv[1], encoding="utf-8", errors="replace").read().strip())
print(f"\ntrained: {trained:.0%} of {n_t} words are common Bible words; random weights: {rand:.0%} of {n_r}")
ok = n_t >= 25 and trained >= 0.6 and rand < 0.35
print("demo model test:", "passed" if ok else "FAILED (want >= 60% trained, < 35% random, >= 25 words)")
sys.exit(0 if ok else 1)
PYEOF
