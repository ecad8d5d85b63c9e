#!/usr/bin/env python3
"""Look into an rlcr table with polars and DuckDB (the recipes of docs/schemas.md, "Opening the tables").

(Not `inspect.py`: a script of that name beside the others would shadow the standard library
module `inspect` for every script in this folder.)

    python3 scripts/inspect_table.py runs/tiny/iter-0004/scored.parquet [--json]

Prints the rows per sample type, the first answers' span tokens, calibration per data source
(over confidence rows; a confidence that did not parse counts as 0.0, as RLCR's evaluation does)
computed twice, with polars and with `scripts/inspect.sql` in DuckDB, and the rlcr metadata. With
`--json`, prints only {"polars": {...}, "duckdb": {...}} of the calibration figures (the tests
compare them with `rlcr report`).
"""
import json
import os
import sys


def polars_calibration(path):
    import polars as pl

    df = pl.read_parquet(path)
    conf = df.filter(pl.col("sample_type") == "confidence").with_columns(
        pl.col("confidence").fill_null(0.0).cast(pl.Float64).alias("c"),
        pl.col("acc_reward").cast(pl.Float64).alias("y"),
    )
    out = (
        conf.group_by("data_source")
        .agg(
            pl.len().alias("confidences"),
            pl.col("y").mean().alias("accuracy"),
            pl.col("c").mean().alias("mean_confidence"),
            ((pl.col("c") - pl.col("y")) ** 2).mean().alias("brier"),
        )
        .sort("data_source")
    )
    return df, out


def span_tokens(df):
    import polars as pl

    s = pl.col("answer_span")
    return (
        df.filter((pl.col("sample_type") == "answer") & s.is_not_null())
        .sort("sample_id")
        .head(5)
        .select(
            "sample_id",
            pl.col("response_ids")
            .list.slice(s.struct.field("start"), s.struct.field("end") - s.struct.field("start"))
            .alias("answer_tokens"),
            "answer",
        )
    )


def duckdb_results(path):
    import duckdb

    sql = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "inspect.sql")).read()
    con = duckdb.connect()
    con.execute("SET VARIABLE t = ?", [path])
    results = []
    # One statement per recipe; comments are dropped, statements end with ';'.
    body = "\n".join(l for l in sql.splitlines() if not l.lstrip().startswith("--"))
    for stmt in (s.strip() for s in body.split(";")):
        if stmt:
            cur = con.execute(stmt)
            cols = [d[0] for d in cur.description]
            results.append((cols, cur.fetchall()))
    return results


def main():
    args = [a for a in sys.argv[1:] if a != "--json"]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    path = args[0]
    df, cal = polars_calibration(path)
    duck = duckdb_results(path)
    if "--json" in sys.argv:
        cols, rows = duck[2]
        json.dump(
            {
                "polars": cal.to_dicts(),
                "duckdb": [dict(zip(cols, r)) for r in rows],
                "span_tokens": [r[1] for r in duck[1][1]],
                "span_tokens_polars": span_tokens(df)["answer_tokens"].to_list(),
            },
            sys.stdout,
        )
        return 0
    import polars as pl

    pl.Config.set_tbl_rows(20)
    print(f"# {path}\n")
    print(df.group_by("sample_type").len().sort("sample_type"))
    print(span_tokens(df))
    print("calibration per data_source (polars):")
    print(cal)
    print("\nthe same recipes in DuckDB (scripts/inspect.sql):")
    for cols, rows in duck:
        print(" | ".join(cols))
        for r in rows:
            print(" | ".join(str(v)[:100] for v in r))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
