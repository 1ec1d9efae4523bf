//! A GGUF model's memory once llama-server loads it, from the file's header alone: the
//! tensors' sizes (the weights), the layer and head counts (the KV cache at the context the
//! engine gives it) and llama-server's own overhead.
//!
//! The header is read ([`read_header`], pure over any reader: a few MB at most, never the
//! tensors) and turned into a [`Footprint`] ([`footprint`], pure). What llama.cpp itself
//! says it allocates for a model is `model + context + compute` (its `memory breakdown`
//! log line and `llama_kv_cache: size = …`), and that is the sum taken:
//!
//! - **weights**: every tensor's elements at its type's block size (ggml's `type_traits`);
//!   a type this table does not know makes it the file's data section instead;
//! - **KV cache**: `context × Σ layers (head_count_kv × (key_length + value_length))` at the
//!   cache types' sizes (f16 unless `--cache-type-k/-v` says otherwise); the context is
//!   `--ctx-size` (0 or absent: the model's trained `context_length`, as llama.cpp does);
//! - **overhead**: llama-server's compute buffer for one batch of `--ubatch-size` tokens
//!   (the feed-forward's two widest activations and the attention scores over a slot's
//!   context, 4 bytes each, and the output logits of each slot) plus the process itself,
//!   [`PROCESS_BYTES`], measured once (docs/models.md says how).

use std::io::Read;

use edge::domain::models::{Footprint, FootprintSource};

/// llama-server's process beyond any model's weights, KV cache and compute buffer: its
/// binary's resident pages, its HTTP server, thread pool and heap. Measured once, on the
/// tests' tiny model (`tests/python/make_tiny_model.py`) in router mode with the tests'
/// flags (`--ctx-size 4096 --parallel 4 --threads 1`): its child's `VmRSS` after one answered
/// request, 26,568 kB (27,205,632 bytes), less the tiny model's weights (4,170,368), KV
/// cache (524,288) and compute buffer (9,162,752) as [`footprint`] counts them: 12.7 MiB
/// (docs/models.md, "Footprints").
pub const PROCESS_BYTES: u64 = 13_348_224;

/// llama.cpp's default `--ubatch-size`: the tokens one compute batch holds.
pub const DEFAULT_UBATCH: u64 = 512;

/// The most of a header read: a model's metadata (its vocabulary included) is a few MB.
const MAX_HEADER: u64 = 64 << 20;

/// Why a header cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// Reading the file failed.
    #[error("cannot read the GGUF file: {0}")]
    Io(#[from] std::io::Error),
    /// It does not start with `GGUF`, or is of a version this reader does not know.
    #[error("not a GGUF file of version 2 or 3 ({0})")]
    NotGguf(String),
    /// A value is malformed or larger than a header may be.
    #[error("malformed GGUF header: {0}")]
    Malformed(String),
}

/// What the footprint needs of a header.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Header {
    /// `general.architecture`.
    pub architecture: String,
    /// `{arch}.block_count`.
    pub layers: u64,
    /// `{arch}.embedding_length`.
    pub embedding: u64,
    /// `{arch}.feed_forward_length`.
    pub feed_forward: u64,
    /// `{arch}.attention.head_count`.
    pub heads: u64,
    /// `{arch}.attention.head_count_kv`, per layer (one value for all, or an array).
    pub heads_kv: Vec<u64>,
    /// `{arch}.attention.key_length` (0: embedding / heads).
    pub key_length: u64,
    /// `{arch}.attention.value_length` (0: embedding / heads).
    pub value_length: u64,
    /// `{arch}.context_length`: the trained context.
    pub context_length: u64,
    /// The vocabulary's size (`{arch}.vocab_size`, else the tokenizer's token count).
    pub vocab: u64,
    /// The tensors' sizes in bytes, summed; `None` when a type is not known.
    pub tensor_bytes: Option<u64>,
    /// Where the tensors' data starts (the header's end, aligned).
    pub data_offset: u64,
}

/// How llama-server runs a model, as its router's `args` for it say.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineArgs {
    /// `--ctx-size` (0: the trained context).
    pub context: u64,
    /// `--parallel`: the slots the context is split between.
    pub parallel: u64,
    /// `--ubatch-size`.
    pub ubatch: u64,
    /// Bytes per element of the K and the V cache (`--cache-type-k`, `--cache-type-v`).
    pub cache_k: f64,
    /// Of the V cache.
    pub cache_v: f64,
}

impl Default for EngineArgs {
    fn default() -> Self {
        Self {
            context: 0,
            parallel: 1,
            ubatch: DEFAULT_UBATCH,
            cache_k: 2.0,
            cache_v: 2.0,
        }
    }
}

impl EngineArgs {
    /// Reads the flags that size a model's memory from llama-server's arguments; the rest
    /// are ignored, and a flag it cannot read keeps its default.
    pub fn parse<'a>(args: impl IntoIterator<Item = &'a str>) -> Self {
        let mut parsed = Self::default();
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let number = |value: Option<&str>| value.and_then(|v| v.parse::<u64>().ok());
            match flag {
                "-c" | "--ctx-size" => parsed.context = number(args.next()).unwrap_or(0),
                "-np" | "--parallel" => {
                    parsed.parallel = number(args.next()).unwrap_or(1).max(1);
                }
                "-ub" | "--ubatch-size" => {
                    parsed.ubatch = number(args.next()).unwrap_or(DEFAULT_UBATCH);
                }
                "-ctk" | "--cache-type-k" => {
                    parsed.cache_k = args.next().and_then(cache_type).unwrap_or(2.0);
                }
                "-ctv" | "--cache-type-v" => {
                    parsed.cache_v = args.next().and_then(cache_type).unwrap_or(2.0);
                }
                _ => {}
            }
        }
        parsed
    }
}

/// Bytes per element of a KV cache type llama-server takes (`f16`, `q8_0`, …).
fn cache_type(name: &str) -> Option<f64> {
    let (bytes, block) = match name {
        "f32" => (4, 1),
        "f16" | "bf16" => (2, 1),
        "q8_0" => (34, 32),
        "q4_0" | "iq4_nl" => (18, 32),
        "q4_1" => (20, 32),
        "q5_0" => (22, 32),
        "q5_1" => (24, 32),
        _ => return None,
    };
    Some(f64::from(bytes) / f64::from(block))
}

/// Bytes per block and elements per block of a ggml type (ggml's `type_traits`), by its
/// number in GGUF.
fn ggml_type(kind: u32) -> Option<(u64, u64)> {
    Some(match kind {
        0 | 26 => (4, 1),
        1 | 25 | 30 => (2, 1),
        24 => (1, 1),
        27 | 28 => (8, 1),
        2 | 20 => (18, 32),
        3 => (20, 32),
        6 => (22, 32),
        7 => (24, 32),
        8 => (34, 32),
        9 => (36, 32),
        39 => (17, 32),
        10 => (84, 256),
        11 | 21 => (110, 256),
        12 => (144, 256),
        13 => (176, 256),
        14 => (210, 256),
        15 => (292, 256),
        16 | 35 => (66, 256),
        17 => (74, 256),
        18 => (98, 256),
        19 => (50, 256),
        22 => (82, 256),
        23 => (136, 256),
        29 => (56, 256),
        34 => (54, 256),
        _ => return None,
    })
}

/// A reader of a header's little-endian values, bounded by [`MAX_HEADER`].
struct Cursor<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Cursor<R> {
    fn bytes(&mut self, n: u64) -> Result<Vec<u8>, GgufError> {
        if self.read + n > MAX_HEADER {
            return Err(GgufError::Malformed(format!(
                "a header larger than {MAX_HEADER} bytes"
            )));
        }
        let mut buf = vec![0; usize::try_from(n).unwrap_or(usize::MAX)];
        self.inner.read_exact(&mut buf)?;
        self.read += n;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let bytes = self.bytes(N as u64)?;
        let mut array = [0; N];
        array.copy_from_slice(&bytes);
        Ok(array)
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> Result<String, GgufError> {
        let len = self.u64()?;
        let bytes = self.bytes(len)?;
        String::from_utf8(bytes).map_err(|e| GgufError::Malformed(e.to_string()))
    }

    /// One value of GGUF type `kind`: its numbers (an integer, or an array's integers, or
    /// an array's length for an array of strings), a string, or nothing to keep.
    fn value(&mut self, kind: u32) -> Result<Value, GgufError> {
        let size = match kind {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => return Ok(Value::Text(self.string()?)),
            9 => return self.array_value(),
            other => return Err(GgufError::Malformed(format!("value type {other}"))),
        };
        let bytes = self.bytes(size)?;
        let mut padded = [0u8; 8];
        padded[..bytes.len()].copy_from_slice(&bytes);
        let number = u64::from_le_bytes(padded);
        // Floats (6, 12) are kept as bits: no key read here is one.
        Ok(Value::Numbers(vec![number]))
    }

    fn array_value(&mut self) -> Result<Value, GgufError> {
        let kind = self.u32()?;
        let len = self.u64()?;
        if kind == 8 {
            for _ in 0..len {
                self.string()?;
            }
            return Ok(Value::Count(len));
        }
        let mut numbers = Vec::new();
        for _ in 0..len {
            if let Value::Numbers(n) = self.value(kind)? {
                numbers.extend(n);
            }
        }
        Ok(Value::Numbers(numbers))
    }
}

/// A metadata value as far as the footprint cares.
enum Value {
    Numbers(Vec<u64>),
    Text(String),
    Count(u64),
}

/// Reads a GGUF header: its metadata and its tensors' shapes and types.
///
/// # Errors
/// [`GgufError::NotGguf`] for another file, [`GgufError::Malformed`] for a header that
/// cannot be read, [`GgufError::Io`] when reading fails.
pub fn read_header(reader: impl Read) -> Result<Header, GgufError> {
    let mut cursor = Cursor {
        inner: reader,
        read: 0,
    };
    let magic: [u8; 4] = cursor.array()?;
    let version = cursor.u32()?;
    if &magic != b"GGUF" || !(2..=3).contains(&version) {
        return Err(GgufError::NotGguf(format!(
            "magic {magic:?}, version {version}"
        )));
    }
    let tensors = cursor.u64()?;
    let keys = cursor.u64()?;
    let mut values = Vec::new();
    for _ in 0..keys {
        let key = cursor.string()?;
        let kind = cursor.u32()?;
        values.push((key, cursor.value(kind)?));
    }
    let mut header = header_of(&values);
    let mut bytes = Some(0u64);
    for _ in 0..tensors {
        cursor.string()?;
        let dims = cursor.u32()?;
        let mut elements = 1u64;
        for _ in 0..dims {
            elements = elements.saturating_mul(cursor.u64()?);
        }
        let kind = cursor.u32()?;
        cursor.u64()?;
        bytes = bytes.zip(ggml_type(kind)).map(|(sum, (size, block))| {
            sum.saturating_add(elements.div_ceil(block).saturating_mul(size))
        });
    }
    let alignment = number_of(&values, "general.alignment").unwrap_or(32).max(1);
    header.tensor_bytes = bytes;
    header.data_offset = cursor.read.div_ceil(alignment) * alignment;
    Ok(header)
}

fn number_of(values: &[(String, Value)], key: &str) -> Option<u64> {
    values.iter().find_map(|(k, v)| match v {
        Value::Numbers(n) if k == key => n.first().copied(),
        _ => None,
    })
}

/// The footprint's keys, read for the file's architecture.
fn header_of(values: &[(String, Value)]) -> Header {
    let architecture = values
        .iter()
        .find_map(|(k, v)| match v {
            Value::Text(text) if k == "general.architecture" => Some(text.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let key = |name: &str| number_of(values, &format!("{architecture}.{name}")).unwrap_or(0);
    let heads_kv = values
        .iter()
        .find_map(|(k, v)| match v {
            Value::Numbers(n) if *k == format!("{architecture}.attention.head_count_kv") => {
                Some(n.clone())
            }
            _ => None,
        })
        .unwrap_or_default();
    let tokens = values.iter().find_map(|(k, v)| match v {
        Value::Count(n) if k == "tokenizer.ggml.tokens" => Some(*n),
        _ => None,
    });
    Header {
        layers: key("block_count"),
        embedding: key("embedding_length"),
        feed_forward: key("feed_forward_length"),
        heads: key("attention.head_count"),
        heads_kv,
        key_length: key("attention.key_length"),
        value_length: key("attention.value_length"),
        context_length: key("context_length"),
        vocab: Some(key("vocab_size"))
            .filter(|n| *n > 0)
            .or(tokens)
            .unwrap_or(0),
        architecture,
        tensor_bytes: None,
        data_offset: 0,
    }
}

/// What `header`'s model takes in llama-server run with `args`, its file being
/// `file_bytes` long (the module's doc says how).
pub fn footprint(header: &Header, args: &EngineArgs, file_bytes: u64) -> Footprint {
    let weights = header
        .tensor_bytes
        .unwrap_or_else(|| file_bytes.saturating_sub(header.data_offset));
    let context = if args.context == 0 {
        header.context_length
    } else {
        args.context
    };
    let per_head = |length: u64| {
        if length > 0 {
            length
        } else {
            header.embedding / header.heads.max(1)
        }
    };
    let (key, value) = (per_head(header.key_length), per_head(header.value_length));
    let heads_kv: u64 = match header.heads_kv.as_slice() {
        [] => header.heads * header.layers,
        [all] => all * header.layers,
        each => each.iter().sum(),
    };
    // Kept to whole bytes: a cache type's size per element may be a fraction.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let kv_cache = (context as f64
        * heads_kv as f64
        * (key as f64 * args.cache_k + value as f64 * args.cache_v)) as u64;
    let slot_context = context.div_ceil(args.parallel.max(1));
    let compute = 4 * args.ubatch * (2 * header.feed_forward + header.heads * slot_context)
        + 4 * args.parallel * header.vocab;
    let overhead = compute + PROCESS_BYTES;
    Footprint {
        bytes: weights + kv_cache + overhead,
        weights,
        kv_cache,
        overhead,
        context: u32::try_from(context).unwrap_or(u32::MAX),
        source: FootprintSource::Gguf,
    }
}

/// A GGUF (version 3) header as gguf-py writes one, without the tensors' data: a llama
/// model's `keys` (each a `u32`), its vocabulary `tokens` and `tensors` (name, dimensions,
/// ggml type), all at offset 0. For tests and tools that need a model's header without its
/// weights.
pub fn llama_header(
    keys: &[(&str, u32)],
    tokens: &[&str],
    tensors: &[(&str, &[u64], u32)],
) -> Vec<u8> {
    let mut out = Vec::new();
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    };
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((keys.len() as u64 + 2).to_le_bytes());
    string(&mut out, "general.architecture");
    out.extend(8u32.to_le_bytes());
    string(&mut out, "llama");
    for (key, value) in keys {
        string(&mut out, key);
        out.extend(4u32.to_le_bytes());
        out.extend(value.to_le_bytes());
    }
    string(&mut out, "tokenizer.ggml.tokens");
    out.extend(9u32.to_le_bytes());
    out.extend(8u32.to_le_bytes());
    out.extend((tokens.len() as u64).to_le_bytes());
    for token in tokens {
        string(&mut out, token);
    }
    for (name, dims, kind) in tensors {
        string(&mut out, name);
        out.extend(u32::try_from(dims.len()).unwrap_or(u32::MAX).to_le_bytes());
        for dim in *dims {
            out.extend(dim.to_le_bytes());
        }
        out.extend(kind.to_le_bytes());
        out.extend(0u64.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A llama model's header with two 1024 × 32,000 tensors of ggml type `tensor_type`.
    fn header_bytes(tensor_type: u32) -> Vec<u8> {
        let keys = [
            ("llama.block_count", 3),
            ("llama.embedding_length", 1024),
            ("llama.feed_forward_length", 2816),
            ("llama.attention.head_count", 8),
            ("llama.attention.head_count_kv", 4),
            ("llama.context_length", 32_768),
            ("llama.vocab_size", 32_000),
        ];
        let dims: &[u64] = &[1024, 32_000];
        let tensors = [
            ("token_embd.weight", dims, tensor_type),
            ("output.weight", dims, tensor_type),
        ];
        llama_header(&keys, &["<s>", "</s>"], &tensors)
    }

    #[test]
    fn a_header_gives_the_tensors_sizes_and_the_models_shape() {
        let header = read_header(header_bytes(1).as_slice()).expect("a header");
        assert_eq!(header.architecture, "llama");
        assert_eq!(
            (header.layers, header.embedding, header.heads),
            (3, 1024, 8)
        );
        assert_eq!(header.heads_kv, [4]);
        assert_eq!(header.vocab, 32_000);
        // Two f16 matrices of 1024 × 32,000.
        assert_eq!(header.tensor_bytes, Some(2 * 1024 * 32_000 * 2));
        assert_eq!(header.data_offset % 32, 0);
        // Q4_0: 18 bytes per 32 elements.
        let q4 = read_header(header_bytes(2).as_slice()).expect("a header");
        assert_eq!(q4.tensor_bytes, Some(2 * 1024 * 32_000 / 32 * 18));
        // A type this reader does not know: the file's data section counts instead.
        let odd = read_header(header_bytes(99).as_slice()).expect("a header");
        assert_eq!(odd.tensor_bytes, None);
        let footprint = footprint(&odd, &EngineArgs::default(), odd.data_offset + 1_000);
        assert_eq!(footprint.weights, 1_000);
    }

    #[test]
    fn the_kv_cache_is_sized_for_the_context_the_engine_gives() {
        let header = read_header(header_bytes(1).as_slice()).expect("a header");
        let args = EngineArgs::parse(["llama-server", "--ctx-size", "4096", "--parallel", "4"]);
        assert_eq!((args.context, args.parallel), (4096, 4));
        let at_4096 = footprint(&header, &args, 0);
        // 4096 tokens × 3 layers × 4 KV heads × (128 + 128) × 2 bytes: 24 MiB, llama.cpp's
        // own `llama_kv_cache: size = 24.00 MiB` for this shape.
        assert_eq!(at_4096.kv_cache, 24 << 20);
        assert_eq!(at_4096.context, 4096);
        assert_eq!(
            at_4096.bytes,
            at_4096.weights + at_4096.kv_cache + at_4096.overhead
        );
        // No --ctx-size: the trained context, eight times the cache.
        let trained = footprint(&header, &EngineArgs::default(), 0);
        assert_eq!(trained.kv_cache, (8 * 24) << 20);
        // A quantized cache is smaller.
        let q8 = EngineArgs::parse(["-c", "4096", "-ctk", "q8_0", "-ctv", "q8_0"]);
        assert!(footprint(&header, &q8, 0).kv_cache < at_4096.kv_cache);
    }

    #[test]
    fn what_is_not_a_gguf_header_is_refused() {
        assert!(matches!(
            read_header(&b"GGML\x03\0\0\0"[..]),
            Err(GgufError::NotGguf(_))
        ));
        assert!(read_header(&b"GGUF\x03\0\0\0"[..]).is_err());
        let mut huge = header_bytes(1);
        huge.truncate(40);
        assert!(read_header(huge.as_slice()).is_err());
    }
}
