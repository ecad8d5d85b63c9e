//! A model folder's fingerprint, recorded in the metadata of every table sampled from it, so a
//! table says which weights produced it.
//!
//! `fnv1a64` over, in order: `config.json`'s bytes, then for every `*.safetensors` file (sorted
//! by name) its name, its size, its JSON header and 64 chunks of 4 KiB of tensor data at evenly
//! spaced offsets (the whole data when it is smaller than that). Hashing every byte of a 15 GB
//! checkpoint would cost seconds per stage; the header pins names, dtypes and shapes, and an
//! update changes every weight, so sampled chunks tell checkpoints of one run apart.
//! The value is 16 hex digits; it identifies, it does not authenticate. A LoRA adapter folder's
//! fingerprint hashes its base's, then `adapter_config.json` and its safetensors the same way.
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::{Context, Result};

use crate::hash::Fnv64;

const CHUNKS: u64 = 64;
const CHUNK: u64 = 4096;

/// Fingerprint of a model folder (see the module docs).
pub fn model_fingerprint(dir: &Path) -> Result<String> {
    fingerprint_with(dir, None)
}

/// Fingerprint of the model `--model dir --adapter adapter` loads: with an adapter, the base's
/// fingerprint, then the adapter folder's; so `--model BASE --adapter DIR` and `--model DIR`
/// (whose recorded base is BASE) give the same value.
pub fn fingerprint_with(dir: &Path, adapter: Option<&Path>) -> Result<String> {
    use crate::model::lora;
    let (base, adapter) = lora::resolve(dir, adapter)?;
    let mut h = Fnv64::default();
    // An adapter: the base's fingerprint, then the adapter's config and tensors.
    let (dir, cfg) = match &adapter {
        Some(a) => {
            h.update(model_fingerprint(&base)?.as_bytes());
            (a.as_path(), a.join(lora::CONFIG_FILE))
        }
        None => (base.as_path(), base.join("config.json")),
    };
    let bytes = std::fs::read(&cfg).with_context(|| format!("reading {}", cfg.display()))?;
    h.update(&bytes);
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    for path in files {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        h.update(name.as_bytes());
        let mut f =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        let size = f
            .metadata()
            .with_context(|| format!("reading {}", path.display()))?
            .len();
        h.update(&size.to_le_bytes());
        let mut n = [0u8; 8];
        f.read_exact(&mut n)
            .with_context(|| format!("{}: not a safetensors file", path.display()))?;
        let header_len = u64::from_le_bytes(n).min(size.saturating_sub(8));
        let mut header = vec![0u8; header_len as usize];
        f.read_exact(&mut header)
            .with_context(|| format!("{}: truncated header", path.display()))?;
        h.update(&header);
        let data_start = 8 + header_len;
        let data_len = size - data_start;
        let mut buf = vec![0u8; CHUNK as usize];
        if data_len <= CHUNKS * CHUNK {
            let mut rest = Vec::new();
            f.read_to_end(&mut rest)
                .with_context(|| format!("reading {}", path.display()))?;
            h.update(&rest);
        } else {
            for i in 0..CHUNKS {
                let off = data_start + (data_len - CHUNK) * i / (CHUNKS - 1);
                f.seek(SeekFrom::Start(off))
                    .with_context(|| format!("reading {}", path.display()))?;
                f.read_exact(&mut buf)
                    .with_context(|| format!("reading {}", path.display()))?;
                h.update(&buf);
            }
        }
    }
    Ok(format!("{:016x}", h.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_st(path: &Path, header: &str, data: &[u8]) {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(data);
        std::fs::write(path, b).unwrap();
    }

    #[test]
    fn fingerprint_sees_config_header_and_weights() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("config.json"), "{}").unwrap();
        let big: Vec<u8> = (0..CHUNKS * CHUNK * 3).map(|i| (i % 251) as u8).collect();
        write_st(&d.path().join("model.safetensors"), "{\"a\":1}", &big);
        let a = model_fingerprint(d.path()).unwrap();
        assert_eq!(a.len(), 16);
        assert_eq!(a, model_fingerprint(d.path()).unwrap());
        // a weight change inside the first sampled chunk
        let mut big2 = big.clone();
        big2[10] ^= 1;
        write_st(&d.path().join("model.safetensors"), "{\"a\":1}", &big2);
        let b = model_fingerprint(d.path()).unwrap();
        assert_ne!(a, b);
        // the config
        std::fs::write(d.path().join("config.json"), "{ }").unwrap();
        assert_ne!(b, model_fingerprint(d.path()).unwrap());
        // small files are hashed whole
        write_st(&d.path().join("model.safetensors"), "{}", &[1, 2, 3]);
        let c = model_fingerprint(d.path()).unwrap();
        write_st(&d.path().join("model.safetensors"), "{}", &[1, 2, 4]);
        assert_ne!(c, model_fingerprint(d.path()).unwrap());
        // missing config: a clear error
        let e = model_fingerprint(&d.path().join("nope")).unwrap_err();
        assert!(format!("{e:#}").contains("config.json"));
    }
}
