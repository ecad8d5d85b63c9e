//! Tests of the level readers: RLE decoding, page headers, and lengths checked against Arrow's
//! own decoding of files written with data pages v1 and v2; damaged chunks refused.
//!
//! A test-only file: its parent declares it `#[cfg(test)] mod tests;`.
use super::pages::*;
use super::*;

#[test]
fn rle_and_bit_packed_runs() {
    let mut out = Vec::new();
    // RLE run: header (5 << 1) = 10, value 1
    assert_eq!(decode_rle(&[10, 1], 1, 5, &mut out, false).unwrap(), None);
    assert_eq!(out, vec![1; 5]);
    // the same run, kept as one value
    assert_eq!(decode_rle(&[10, 1], 1, 5, &mut out, true).unwrap(), Some(1));
    assert!(out.is_empty());
    // two runs are expanded even when asked for uniform
    assert_eq!(
        decode_rle(&[4, 1, 6, 0], 1, 5, &mut out, true).unwrap(),
        None
    );
    assert_eq!(out, vec![1, 1, 0, 0, 0]);
    // bit-packed, width 1, one group (header 0b11): bits 0b1011_0010 -> LSB first
    decode_rle(&[3, 0b1011_0010], 1, 8, &mut out, false).unwrap();
    assert_eq!(out, vec![0, 1, 0, 0, 1, 1, 0, 1]);
    // width 2, one group of 8 (2 bytes): values 0,1,2,3,3,2,1,0
    // byte0 = 0 | 1<<2 | 2<<4 | 3<<6 = 0b11_10_01_00 ; byte1 = 3 | 2<<2 | 1<<4 | 0<<6
    decode_rle(&[3, 0b1110_0100, 0b0001_1011], 2, 8, &mut out, false).unwrap();
    assert_eq!(out, vec![0, 1, 2, 3, 3, 2, 1, 0]);
    // a bit-packed group padded past n
    decode_rle(&[3, 0xff], 1, 3, &mut out, false).unwrap();
    assert_eq!(out, vec![1, 1, 1]);
    // truncated data is an error, not a panic
    assert!(decode_rle(&[3], 1, 8, &mut out, false).is_err());
    assert!(decode_rle(&[10], 1, 5, &mut out, false).is_err());
    assert_eq!(bit_width(0), 0);
    assert_eq!(bit_width(1), 1);
    assert_eq!(bit_width(2), 2);
    assert_eq!(bit_width(3), 2);
}

/// Lengths read by levels equal the decoded lists' offsets and nulls: required and nullable
/// lists, empty lists, null elements, lists with neither (read from the row starts alone),
/// many pages a row group, several row groups, data pages v1 and v2, with and without
/// dictionaries.
#[test]
fn lengths_match_decoded_lists() {
    use arrow::array::{Array, ArrayRef, Int32Array, ListArray, RecordBatch};
    use arrow::buffer::{NullBuffer, OffsetBuffer};
    use arrow::datatypes::{DataType, Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterVersion;

    let n = 300usize;
    // lengths 0..=11 in a scrambled order; every 7th row of `opt` is null, every 5th value
    // of both lists is a null element
    let lens: Vec<usize> = (0..n).map(|i| (i * 7 + i / 3) % 12).collect();
    let list = |nullable: bool| -> ArrayRef {
        let total: usize = lens.iter().sum();
        let values: Int32Array = (0..total)
            .map(|k| (k % 5 != 0).then_some(k as i32 % 97))
            .collect();
        let item = Arc::new(Field::new("item", DataType::Int32, true));
        let nulls = nullable.then(|| NullBuffer::from_iter((0..n).map(|i| i % 7 != 3)));
        Arc::new(ListArray::new(
            item,
            OffsetBuffer::from_lengths(lens.iter().copied()),
            Arc::new(values),
            nulls,
        ))
    };
    // no null element and no empty list: the path that reads only the row starts
    let dense_lens: Vec<usize> = lens.iter().map(|l| l + 1).collect();
    let dense: ArrayRef = Arc::new(ListArray::new(
        Arc::new(Field::new("item", DataType::Int32, false)),
        OffsetBuffer::from_lengths(dense_lens.iter().copied()),
        Arc::new(Int32Array::from_iter_values(
            (0..dense_lens.iter().sum::<usize>()).map(|k| k as i32 % 89),
        )),
        None,
    ));
    let schema = Arc::new(Schema::new(vec![
        Field::new("ids", list(false).data_type().clone(), false),
        Field::new("opt", list(true).data_type().clone(), true),
        Field::new("dense", dense.data_type().clone(), false),
    ]));
    let batch = RecordBatch::try_new(schema.clone(), vec![list(false), list(true), dense]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let zstd = Compression::ZSTD(parquet::basic::ZstdLevel::try_new(3).unwrap());
    for (version, dict, codec, page_stats) in [
        (WriterVersion::PARQUET_1_0, true, zstd, false),
        (WriterVersion::PARQUET_1_0, false, zstd, true),
        (WriterVersion::PARQUET_2_0, true, zstd, false),
        (WriterVersion::PARQUET_2_0, false, zstd, true),
        (
            WriterVersion::PARQUET_1_0,
            true,
            Compression::UNCOMPRESSED,
            true,
        ),
        (
            WriterVersion::PARQUET_2_0,
            false,
            Compression::UNCOMPRESSED,
            false,
        ),
        (
            WriterVersion::PARQUET_1_0,
            false,
            Compression::SNAPPY,
            false,
        ),
        (WriterVersion::PARQUET_2_0, true, Compression::SNAPPY, true),
    ] {
        let path = dir
            .path()
            .join(format!("t-{version:?}-{dict}-{codec}-{page_stats}.parquet"));
        // the tables' own settings, with small pages and the page version under test
        let props = crate::table::io::writer_properties(crate::table::io::Encoding::Table, None)
            .unwrap()
            .into_builder()
            .set_writer_version(version)
            .set_dictionary_enabled(dict)
            .set_compression(codec)
            .set_write_page_header_statistics(page_stats)
            .set_data_page_row_count_limit(16)
            .set_write_batch_size(8)
            .set_max_row_group_row_count(Some(128))
            .build();
        let mut w = ArrowWriter::try_new(File::create(&path).unwrap(), schema.clone(), Some(props))
            .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let parts = super::super::splice::open_parts(&path).unwrap();
        assert!(parts[0].row_groups() >= 3);
        for name in ["ids", "opt", "dense"] {
            let want = batch.column_by_name(name).unwrap();
            let want = want.as_any().downcast_ref::<ListArray>().unwrap();
            // a null list is written without elements: length 0
            let want_len: Vec<u32> = (0..n)
                .map(|i| {
                    if want.is_null(i) {
                        0
                    } else {
                        want.value_length(i) as u32
                    }
                })
                .collect();
            let want_null: Vec<bool> = (0..n).map(|i| want.is_null(i)).collect();
            assert!(supported(&parts[0], name));
            // the raw pages and the parquet crate's page reader agree, page header by
            // page header and in the lengths they give
            let raw = codec != Compression::SNAPPY;
            for rg in 0..parts[0].row_groups() {
                let a = lengths_by(&parts[0], rg, name, None).unwrap();
                assert_eq!(row_group_lengths(&parts[0], rg, name).unwrap(), a);
                if raw {
                    // pages read a few bytes at first, then more as the headers and levels
                    // need them
                    for front in [1, 3, 17, FRONT] {
                        let b = lengths_by(&parts[0], rg, name, Some(front)).unwrap();
                        assert_eq!(b, a, "front {front}");
                    }
                    same_headers(&parts[0], rg, name);
                }
            }
            let mut s = Stream::new(&parts, name);
            // uneven windows that cross row groups
            let mut first = 0;
            for step in [1usize, 50, 77, 100, 72] {
                s.fill(first, step).unwrap();
                let (len, null) = s.get(first, step);
                let ctx = format!("{version:?} dict {dict} {name} rows {first}..+{step}");
                assert_eq!(len, &want_len[first..first + step], "{ctx}");
                match name {
                    "opt" => {
                        assert_eq!(null.unwrap(), &want_null[first..first + step], "{ctx}")
                    }
                    _ => assert!(null.is_none(), "{ctx}"),
                }
                first += step;
            }
            assert_eq!(first, n);
        }
    }
}

/// The headers [`PageHeader::parse`] reads from a column chunk's bytes, beside the pages
/// the parquet crate reads from it: the same kinds, sizes, value counts, level encodings and
/// v2 level lengths.
fn same_headers(part: &Part, rg: usize, column: &str) {
    use std::os::unix::fs::FileExt;
    let lf = leaf(part, column).unwrap();
    let meta = part.meta.metadata().row_group(rg).column(lf.index);
    let (start, len) = meta.byte_range();
    let mut chunk = vec![0u8; len as usize];
    part.file.read_exact_at(&mut chunk, start).unwrap();
    let file = Arc::new(File::open(&part.path).unwrap());
    let mut pages = SerializedPageReader::new(file, meta, part.rg_rows(rg), None).unwrap();
    let mut pos = 0;
    let mut n = 0;
    while let Some(page) = pages.get_next_page().unwrap() {
        let (h, hlen) = PageHeader::parse(&chunk[pos..]).unwrap();
        // every prefix of a header is refused, never a panic
        for cut in 0..hlen {
            assert!(PageHeader::parse(&chunk[pos..pos + cut]).is_err(), "{cut}");
        }
        pos += hlen + h.compressed;
        let want = match &page {
            Page::DictionaryPage { .. } => PageData::Other,
            Page::DataPage {
                num_values,
                def_level_encoding,
                rep_level_encoding,
                ..
            } => PageData::V1 {
                num_values: *num_values as usize,
                rle: *def_level_encoding == Encoding::RLE && *rep_level_encoding == Encoding::RLE,
            },
            Page::DataPageV2 {
                num_values,
                def_levels_byte_len,
                rep_levels_byte_len,
                ..
            } => PageData::V2 {
                num_values: *num_values as usize,
                rep_len: *rep_levels_byte_len as usize,
                def_len: *def_levels_byte_len as usize,
            },
        };
        assert_eq!(h.data, want);
        assert_eq!(h.uncompressed, page.buffer().len());
        n += 1;
    }
    assert_eq!(pos, chunk.len());
    assert!(n >= 2);
}

/// A column chunk cut short or with a damaged page is an error naming the place, never a
/// panic or wrong lengths.
#[test]
fn damaged_chunks_are_refused() {
    use arrow::array::{ArrayRef, Int32Array, ListArray, RecordBatch};
    use arrow::buffer::OffsetBuffer;
    use arrow::datatypes::{DataType, Field, Schema};
    use parquet::arrow::ArrowWriter;
    use std::os::unix::fs::FileExt;

    let lens: Vec<usize> = (0..200).map(|i| 1 + i % 9).collect();
    let total: usize = lens.iter().sum();
    let ids: ArrayRef = Arc::new(ListArray::new(
        Arc::new(Field::new("item", DataType::Int32, false)),
        OffsetBuffer::from_lengths(lens.iter().copied()),
        Arc::new(Int32Array::from_iter_values(
            (0..total as i32).map(|k| k * 7919),
        )),
        None,
    ));
    let schema = Arc::new(Schema::new(vec![Field::new(
        "ids",
        ids.data_type().clone(),
        false,
    )]));
    let batch = RecordBatch::try_new(schema.clone(), vec![ids]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    let props = crate::table::io::writer_properties(crate::table::io::Encoding::Table, None)
        .unwrap()
        .into_builder()
        .set_dictionary_enabled(false)
        .set_data_page_row_count_limit(64)
        .set_write_batch_size(16)
        .build();
    let mut w = ArrowWriter::try_new(File::create(&path).unwrap(), schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let parts = super::super::splice::open_parts(&path).unwrap();
    let good = row_group_lengths(&parts[0], 0, "ids").unwrap();
    let want: Vec<u32> = lens.iter().map(|&l| l as u32).collect();
    assert_eq!(good.len, want);
    let meta = parts[0].meta.metadata().row_group(0).column(0);
    let (start, len) = meta.byte_range();
    let mut bytes = std::fs::read(&path).unwrap();
    // flip bytes across the chunk, one at a time (page headers, level blocks, values): the
    // result is the right lengths or an error, never a panic
    let mut errors = 0;
    for at in (start..start + len).step_by(7) {
        let old = bytes[at as usize];
        bytes[at as usize] = old ^ 0x5a;
        let f = File::options().write(true).open(&path).unwrap();
        f.write_all_at(&bytes, 0).unwrap();
        match row_group_lengths(&parts[0], 0, "ids") {
            // a flip in the values (never read), or one the levels survive with the row
            // count the metadata gives (the format has no checksum to notice it)
            Ok(l) => assert_eq!(l.len.len(), want.len()),
            Err(e) => {
                let msg = format!("{e:#}");
                assert!(
                    msg.contains("row group 0") && msg.contains("`ids`"),
                    "{msg}"
                );
                errors += 1;
            }
        }
        bytes[at as usize] = old;
    }
    assert!(errors > 0);
    // cut short: an error
    let f = File::options().write(true).open(&path).unwrap();
    f.set_len(start + len / 2).unwrap();
    let e = format!("{:#}", row_group_lengths(&parts[0], 0, "ids").unwrap_err());
    assert!(e.contains("corrupt or truncated"), "{e}");
}
