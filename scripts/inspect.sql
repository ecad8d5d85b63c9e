-- Recipes for rlcr tables in DuckDB. Lists are 1-based in DuckDB, spans are 0-based and
-- end-exclusive: the tokens of a span are response_ids[span.start + 1 : span."end"].
-- Pick the table first (DuckDB ≥ 1.1), e.g. in the duckdb shell:
--   SET VARIABLE t = 'runs/tiny/iter-0004/scored.parquet';
--   .read scripts/inspect.sql
-- or run `python3 scripts/inspect_table.py TABLE.parquet`, which does both and prints the results.

-- 1. Rows per sample type.
select sample_type, count(*) as rows
from read_parquet(getvariable('t'))
group by sample_type order by sample_type;

-- 2. The answer tokens of the first answers (the span slice) beside the extracted answer.
select sample_id,
       response_ids[answer_span.start + 1 : answer_span."end"] as answer_tokens,
       answer
from read_parquet(getvariable('t'))
where sample_type = 'answer' and answer_span is not null
order by sample_id limit 5;

-- 3. Calibration per data source, over confidence rows (RLCR's evaluation: a confidence that did
--    not parse counts as 0.0). acc_reward on a confidence row is its answer's accuracy.
select data_source,
       count(*) as confidences,
       avg(acc_reward) as accuracy,
       avg(coalesce(confidence, 0.0)) as mean_confidence,
       avg(power(coalesce(confidence, 0.0) - acc_reward, 2)) as brier
from read_parquet(getvariable('t'))
where sample_type = 'confidence'
group by data_source order by data_source;

-- 4. What wrote the table: stage, configuration, inputs (rlcr.* key-value metadata).
select decode(key) as key, decode(value) as value
from parquet_kv_metadata(getvariable('t'))
where decode(key) like 'rlcr.%' order by key;
