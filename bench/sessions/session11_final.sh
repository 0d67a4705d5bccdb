python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export CODE2WAV_CACHE=/tmp/c2w PYTHONUNBUFFERED=1; P=$PWD:/tmp/site; Q=/tmp/site:$PWD
echo "=== cold start to first audio"; COLD_START_UNTIL="first audio" PYTHONPATH=$P timeout 50 python3 bench/cold_start.py serve --device cuda --dtype bfloat16 --max-streams 256 2>&1 | grep -v "^{" | tee $OUT/cold_first_audio.txt
echo "=== vllm"; PYTHONPATH=$Q timeout 160 python3 bench/integration_vllm.py --repeats 2 --out $OUT/integration_vllm.json > $OUT/integration_vllm.txt 2>&1; grep -v "^{" $OUT/integration_vllm.txt | tail -12
echo "=== sglang"; PYTHONPATH=$Q timeout 150 python3 bench/integration_sglang.py --frames 150 --out $OUT/integration_sglang.json > $OUT/integration_sglang.txt 2>&1; grep -v "^{" $OUT/integration_sglang.txt | tail -12
echo "=== warm"; PYTHONPATH=$P timeout 60 python3 bench/warm_check.py float32 4 2>&1 | tail -6 | tee $OUT/warm_check.txt
loads='for spec in "1 1" "8 8" "8 32"; do python3 bench/service_load.py http://127.0.0.1:8091 $spec 8 | tee -a '$OUT'/service_load.jsonl | cut -c1-160; done'
echo "=== fullload"; PYTHONPATH=$P timeout 150 python3 bench/cold_start.py serve --then "$loads" --device cuda --dtype bfloat16 --max-streams 256 2>&1 | grep -v "^{" | tee $OUT/fullload.txt
