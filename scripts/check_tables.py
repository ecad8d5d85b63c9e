#!/usr/bin/env python3
"""Open rlcr tables in polars and DuckDB and check types, metadata and span slicing.

usage: check_tables.py FILE.parquet [FILE.parquet ...]

Exit 0 when every check passes, 1 with a message otherwise, 3 when polars or duckdb cannot be
imported (the caller decides whether that is a failure). Used by the integration tests; also a
recipe for users (see docs/schemas.md).
"""
import json
import sys

try:
    import duckdb
    import polars as pl
except ImportError as e:  # pragma: no cover
    print(f"missing python module: {e}", file=sys.stderr)
    sys.exit(3)

POLARS_TYPES = {
    "utf8": (pl.String,),
    "int32": (pl.Int32,),
    "float32": (pl.Float32,),
    "bool": (pl.Boolean,),
    "list<int32>": (pl.List(pl.Int32),),
    "list<float32>": (pl.List(pl.Float32),),
    "list<bool>": (pl.List(pl.Boolean),),
}


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)


def check(path):
    meta = pl.read_parquet_metadata(path)
    for key in ["rlcr.schema", "rlcr.schema_version", "rlcr.stage", "rlcr.config", "rlcr.inputs", "rlcr.version"]:
        if key not in meta:
            fail(f"{path}: polars does not see metadata key {key}: {sorted(meta)}")
    json.loads(meta["rlcr.config"])
    kind = meta["rlcr.schema"].split(".")[-1]
    try:
        schema = json.load(open(f"{SCHEMAS}/{kind}.json"))
    except FileNotFoundError:
        # Tables without a schemas/ file (calibration.parquet): metadata and row counts only.
        schema = {"columns": []}
    df = pl.read_parquet(path)
    for col in schema["columns"]:
        name, ty = col["name"], col["type"]
        if name not in df.columns:
            continue
        if ty in POLARS_TYPES and df.schema[name] not in POLARS_TYPES[ty]:
            fail(f"{path}: polars reads column {name} as {df.schema[name]}, documented {ty}")
        if ty.startswith("struct<start") and not isinstance(df.schema[name], pl.Struct):
            fail(f"{path}: polars reads span column {name} as {df.schema[name]}")
        # Native conversations, or JSON text where a version 1 table's column was copied through.
        if ty.startswith("list<struct<role") and df.schema[name] not in (
            pl.List(pl.Struct({"role": pl.String, "content": pl.String})),
            pl.String,
        ):
            fail(f"{path}: polars reads {name} as {df.schema[name]}, documented {ty}")
        if not col["nullable"] and df[name].null_count() > 0:
            fail(f"{path}: non-nullable column {name} has nulls")
    con = duckdb.connect()
    kv = dict(
        (k.decode() if isinstance(k, bytes) else k, v.decode() if isinstance(v, bytes) else v)
        for k, v in con.execute("select key, value from parquet_kv_metadata(?)", [path]).fetchall()
    )
    if kv.get("rlcr.schema") != meta["rlcr.schema"]:
        fail(f"{path}: duckdb parquet_kv_metadata lacks rlcr.schema: {sorted(kv)}")
    n = con.execute("select count(*) from read_parquet(?)", [path]).fetchone()[0]
    if n != df.height:
        fail(f"{path}: duckdb counts {n} rows, polars {df.height}")
    # Nested columns: DuckDB reads the same conversations and extra-info fields as polars, and
    # its recipes (`messages[1].content`, `extra_info.<key>`) reach into them.
    if "messages" in df.columns and isinstance(df.schema["messages"], pl.List):
        duck = [r[0] for r in con.execute("select messages from read_parquet(?)", [path]).fetchall()]
        if duck != df["messages"].to_list():
            fail(f"{path}: duckdb and polars read different messages")
        first = con.execute("select messages[1].role, messages[1].content from read_parquet(?)",
                            [path]).fetchall()
        pfirst = df.select(pl.col("messages").list.first().struct.field("role"),
                           pl.col("messages").list.first().struct.field("content")).rows()
        if [tuple(r) for r in first] != [tuple(r) for r in pfirst]:
            fail(f"{path}: duckdb messages[1] differs from polars list.first()")
    if "extra_info" in df.columns and isinstance(df.schema["extra_info"], pl.Struct):
        for field in df.schema["extra_info"].fields:
            duck = [r[0] for r in con.execute(
                f'select extra_info."{field.name}" from read_parquet(?)', [path]).fetchall()]
            pol = df["extra_info"].struct.field(field.name).to_list()
            if duck != pol:
                fail(f"{path}: extra_info.{field.name}: duckdb {duck[:3]} != polars {pol[:3]}")
    # Span slicing recipe: DuckDB lists are 1-based, so [start+1 : end] is the span.
    if "answer_span" in df.columns and "response_ids" in df.columns:
        rows = con.execute(
            "select response_ids, answer_span.start, answer_span.\"end\", "
            "response_ids[answer_span.start + 1 : answer_span.\"end\"] from read_parquet(?) "
            "where answer_span is not null", [path]).fetchall()
        for ids, s, e, sl in rows:
            if list(sl) != list(ids[s:e]):
                fail(f"{path}: duckdb span slice {sl} != python slice {ids[s:e]}")
        pol = df.filter(pl.col("answer_span").is_not_null()).select(
            pl.col("response_ids").list.slice(
                pl.col("answer_span").struct.field("start"),
                pl.col("answer_span").struct.field("end") - pl.col("answer_span").struct.field("start"),
            ).alias("span"), "response_ids", "answer_span")
        for r in pol.iter_rows(named=True):
            s, e = r["answer_span"]["start"], r["answer_span"]["end"]
            if r["span"] != r["response_ids"][s:e]:
                fail(f"{path}: polars list.slice {r['span']} != {r['response_ids'][s:e]}")
    print(f"ok {path}: {df.height} rows, schema {meta['rlcr.schema']}")


if __name__ == "__main__":
    import os
    SCHEMAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "schemas")
    if len(sys.argv) < 2:
        fail(__doc__)
    for p in sys.argv[1:]:
        check(p)
