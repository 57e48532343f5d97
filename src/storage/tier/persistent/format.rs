//! The on-disk format: every byte layout the store writes, as typed heed codecs.
//!
//! Inside LMDB's `data.mdb`:
//! - the named database [`META_DB`] (the [`Catalog`]) maps
//!   - the key [`FORMAT_KEY`] to [`FORMAT`] (the layout version), and
//!   - each table name (UTF-8, e.g. `wdl/table0`) to a [`TableRecord`]: a float32 table's is
//!     16 bytes, `[layout u32 LE = 1][state u32 LE: 0 = loading, 1 = complete][dim u64 LE]` (as
//!     every table's was before rows could be stored in other formats, so those stores read
//!     unchanged); another format's is 24 bytes, `[layout u32 LE = 2][state][dim][row format
//!     u32 LE: 2 float16, 3 bfloat16, 4 int8, 5 int4, 6 fp8 (`strata_storage`'s numbers)][0 u32]`,
//!     and
//!   - [`COMMITS_PREFIX`]`<name>` to the table's commit counter (`u64` LE, absent = 0): every
//!     upsert and every erase that removed a row adds 1 inside its own write transaction, so
//!     other processes sharing the store notice that the table changed;
//! - each table is the named database [`TABLE_PREFIX`]`<name>` ([`Rows`]): key = the canonical
//!   64-bit key (the bit pattern of HugeCTR's int64) as 8 **big-endian** bytes ([`BeKey`]), so
//!   LMDB's byte order is numeric `u64` order; value = the row in the table's format
//!   ([`LeRow`]): `dim` little-endian float32 (`dim * 4` bytes) for a float32 table, else the
//!   format's bytes (`RowFormat::row_bytes`, e.g. FBGEMM's fused int8 layout), checked on every
//!   read.
//!
//! Stored bytes that do not decode are reported as [`Corrupt`], whose message the store errors
//! carry as they are.

use crate::dlpack::FloatDtype;
use crate::kernels::RowFormat;
use heed::byteorder::BigEndian;
use heed::types::{Bytes, Str, U64};
use heed::{BoxedError, BytesDecode, BytesEncode, Database, RoTxn, RwTxn};
use std::borrow::Cow;

/// The catalog's database name.
pub(super) const META_DB: &str = "strata.meta";
/// A table `name` is the database `t/<name>`.
pub(super) const TABLE_PREFIX: &str = "t/";
/// The catalog key of the layout version. A table name never holds a NUL, so this key is never
/// a table's.
pub(super) const FORMAT_KEY: &str = "\0format";
/// The catalog key of table `name`'s commit counter is `"\0commits/<name>"` (a NUL, so never a
/// table's name).
pub(super) const COMMITS_PREFIX: &str = "\0commits/";
/// The layout version this code reads and writes.
pub(super) const FORMAT: &[u8] = b"strata-persistent-1";
/// The record layout of float32 tables.
const RECORD_LAYOUT: u32 = 1;
/// The record layout of tables stored in another format (it records the format).
const RECORD_LAYOUT_FORMAT: u32 = 2;
const STATE_LOADING: u32 = 0;
const STATE_COMPLETE: u32 = 1;

/// Stored bytes that do not decode; the message says what was found and what was expected.
#[derive(Debug)]
pub(super) struct Corrupt(pub(super) String);

impl std::fmt::Display for Corrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Corrupt {}

/// The key codec of a table: a `u64` as 8 big-endian bytes (heed's [`U64<BigEndian>`]), so
/// LMDB's byte order is numeric order. Decoding anything but 8 bytes is [`Corrupt`].
pub(super) enum BeKey {}

impl<'a> BytesEncode<'a> for BeKey {
    type EItem = u64;

    fn bytes_encode(key: &'a u64) -> Result<Cow<'a, [u8]>, BoxedError> {
        U64::<BigEndian>::bytes_encode(key)
    }
}

impl<'a> BytesDecode<'a> for BeKey {
    type DItem = u64;

    fn bytes_decode(bytes: &'a [u8]) -> Result<u64, BoxedError> {
        if bytes.len() != 8 {
            return Err(Box::new(Corrupt(format!("corrupt key: {} bytes; expected 8", bytes.len()))));
        }
        U64::<BigEndian>::bytes_decode(bytes)
    }
}

/// A row in its stored encoding: for a float32 table, float32 values, little-endian, back to
/// back (the encoding of HugeCTR's `emb_vector` too, so a sparse folder's rows are stored as
/// they are); for another format, its bytes (`RowFormat::row_bytes`). Borrowed (from the
/// caller, a sparse file or LMDB's map); its length is checked when it is read.
#[derive(Clone, Copy)]
pub(super) struct LeRow<'a>(&'a [u8]);

impl<'a> LeRow<'a> {
    /// Rows already in this encoding (a sparse folder's `emb_vector` rows, a float32 table's).
    pub(super) fn from_le_bytes(bytes: &'a [u8]) -> Self {
        LeRow(bytes)
    }

    /// Encodes `values` as `format` into `buf` (resized, and reused from row to row); fails,
    /// saying why, on values the format cannot hold (see `quantize_row`).
    pub(super) fn encode(format: RowFormat, values: &[f32], buf: &'a mut Vec<u8>) -> Result<Self, String> {
        buf.clear();
        buf.resize(format.row_bytes(values.len()), 0);
        crate::kernels::quantize_row(format, values, buf)?;
        Ok(LeRow(buf))
    }

    /// The stored bytes of the row of `key` in a table of `format` rows of `dim` values: a
    /// stored row of any other length is [`Corrupt`].
    pub(super) fn bytes(self, key: u64, format: RowFormat, dim: usize) -> Result<&'a [u8], Corrupt> {
        let want = format.row_bytes(dim);
        if self.0.len() != want {
            let what = if format == RowFormat::Float(FloatDtype::F32) {
                format!("{dim} float32")
            } else {
                format!("a {} row of {dim}", format.name())
            };
            return Err(Corrupt(format!("corrupt row for key {key}: {} bytes; expected {want} ({what})", self.0.len())));
        }
        Ok(self.0)
    }

    /// Decodes the row of `key`, stored as `format`, into `out` (its `dim` values, dequantized
    /// exactly as lookups of that format read them); a stored row of another length is
    /// [`Corrupt`].
    pub(super) fn decode_into(self, key: u64, format: RowFormat, out: &mut [f32]) -> Result<(), Corrupt> {
        let bytes = self.bytes(key, format, out.len())?;
        let f = crate::kernels::pool::convert_fn(crate::kernels::isa(), format, FloatDtype::F32);
        // SAFETY: `bytes` is one stored row of `format` (row_bytes(dim), checked above; the row
        // kernels read at any alignment) and `out` holds dim float32 that do not overlap it.
        unsafe { f(bytes.as_ptr(), out.as_mut_ptr().cast(), out.len(), 1) };
        Ok(())
    }
}

/// The value codec of a table: a [`LeRow`], stored as its bytes.
pub(super) enum RowCodec {}

impl<'a> BytesEncode<'a> for RowCodec {
    type EItem = LeRow<'a>;

    fn bytes_encode(row: &'a LeRow<'a>) -> Result<Cow<'a, [u8]>, BoxedError> {
        Ok(Cow::Borrowed(row.0))
    }
}

impl<'a> BytesDecode<'a> for RowCodec {
    type DItem = LeRow<'a>;

    fn bytes_decode(bytes: &'a [u8]) -> Result<LeRow<'a>, BoxedError> {
        Ok(LeRow(bytes))
    }
}

/// A table's rows.
pub(super) type Rows = Database<BeKey, RowCodec>;

/// A table's catalog record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TableRecord {
    /// False while a first bulk load is under way (or was cut short).
    pub(super) complete: bool,
    pub(super) dim: u64,
    /// How the table stores its rows (float32 for every table a store had before formats).
    pub(super) format: RowFormat,
}

/// A row format's number in a record (`strata_storage`'s numbering).
const FORMAT_CODES: [(u32, RowFormat); 6] = [
    (1, RowFormat::Float(FloatDtype::F32)),
    (2, RowFormat::Float(FloatDtype::F16)),
    (3, RowFormat::Float(FloatDtype::BF16)),
    (4, RowFormat::Int8),
    (5, RowFormat::Int4),
    (6, RowFormat::Fp8),
];

impl TableRecord {
    fn encode(self) -> Vec<u8> {
        let float32 = self.format == RowFormat::Float(FloatDtype::F32);
        let mut b = Vec::with_capacity(24);
        b.extend_from_slice(&(if float32 { RECORD_LAYOUT } else { RECORD_LAYOUT_FORMAT }).to_le_bytes());
        let state = if self.complete { STATE_COMPLETE } else { STATE_LOADING };
        b.extend_from_slice(&state.to_le_bytes());
        b.extend_from_slice(&self.dim.to_le_bytes());
        if !float32 {
            let code = FORMAT_CODES.iter().find(|(_, f)| *f == self.format).map_or(0, |(c, _)| *c);
            b.extend_from_slice(&code.to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
        }
        b
    }

    fn decode(v: &[u8]) -> Result<TableRecord, Corrupt> {
        let corrupt = |why: String| Corrupt(format!("corrupt metadata record: {why}"));
        let word = |at: usize| v.get(at..at + 4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
        let len = match word(0) {
            Some(RECORD_LAYOUT) => 16,
            Some(RECORD_LAYOUT_FORMAT) => 24,
            Some(layout) => {
                return Err(corrupt(format!("layout {layout}; this strata reads layouts {RECORD_LAYOUT} and {RECORD_LAYOUT_FORMAT}")));
            }
            None => return Err(corrupt(format!("{} bytes; expected 16 or 24", v.len()))),
        };
        if v.len() != len {
            return Err(corrupt(format!("{} bytes; expected {len}", v.len())));
        }
        let format = match word(16) {
            None => RowFormat::Float(FloatDtype::F32),
            Some(code) => FORMAT_CODES
                .iter()
                .find(|(c, _)| *c == code)
                .map(|(_, f)| *f)
                .ok_or_else(|| corrupt(format!("row format {code}; this strata reads formats 1 to 6")))?,
        };
        let complete = match word(4) {
            Some(STATE_LOADING) => false,
            Some(STATE_COMPLETE) => true,
            s => return Err(corrupt(format!("state {}; expected 0 (loading) or 1 (complete)", s.unwrap_or(0)))),
        };
        let mut dim = [0u8; 8];
        dim.copy_from_slice(&v[8..16]);
        Ok(TableRecord { complete, dim: u64::from_le_bytes(dim), format })
    }
}

/// The value codec of a catalog record.
pub(super) enum RecordCodec {}

impl<'a> BytesEncode<'a> for RecordCodec {
    type EItem = TableRecord;

    fn bytes_encode(record: &'a TableRecord) -> Result<Cow<'a, [u8]>, BoxedError> {
        Ok(Cow::Owned(record.encode()))
    }
}

impl<'a> BytesDecode<'a> for RecordCodec {
    type DItem = TableRecord;

    fn bytes_decode(bytes: &'a [u8]) -> Result<TableRecord, BoxedError> {
        TableRecord::decode(bytes).map_err(|e| Box::new(e) as BoxedError)
    }
}

/// The catalog, [`META_DB`]: the layout version and a record per table, by name.
#[derive(Clone, Copy)]
pub(super) struct Catalog(Database<Str, Bytes>);

impl Catalog {
    pub(super) fn open(env: &heed::Env<heed::WithoutTls>, txn: &RoTxn) -> heed::Result<Option<Catalog>> {
        Ok(env.open_database(txn, Some(META_DB))?.map(Catalog))
    }

    pub(super) fn create(env: &heed::Env<heed::WithoutTls>, txn: &mut RwTxn) -> heed::Result<Catalog> {
        env.create_database(txn, Some(META_DB)).map(Catalog)
    }

    /// The layout version recorded, if any.
    pub(super) fn format<'t>(&self, txn: &'t RoTxn) -> heed::Result<Option<&'t [u8]>> {
        self.0.get(txn, FORMAT_KEY)
    }

    /// Records this code's layout version.
    pub(super) fn put_format(&self, txn: &mut RwTxn) -> heed::Result<()> {
        self.0.put(txn, FORMAT_KEY, FORMAT)
    }

    fn records(&self) -> Database<Str, RecordCodec> {
        self.0.remap_data_type()
    }

    /// Table `name`'s record, if any; a record that does not decode is a [`Corrupt`] decoding
    /// error.
    pub(super) fn record(&self, txn: &RoTxn, name: &str) -> heed::Result<Option<TableRecord>> {
        self.records().get(txn, name)
    }

    pub(super) fn put_record(&self, txn: &mut RwTxn, name: &str, record: TableRecord) -> heed::Result<()> {
        self.records().put(txn, name, &record)
    }

    /// Table `name`'s commit counter (0 when never written).
    pub(super) fn commits(&self, txn: &RoTxn, name: &str) -> heed::Result<u64> {
        let key = format!("{COMMITS_PREFIX}{name}");
        match self.0.get(txn, &key)? {
            None => Ok(0),
            Some(v) => match <[u8; 8]>::try_from(v) {
                Ok(b) => Ok(u64::from_le_bytes(b)),
                Err(_) => Err(heed::Error::Decoding(Box::new(Corrupt(format!("corrupt commit counter: {} bytes; expected 8", v.len()))))),
            },
        }
    }

    /// Stores table `name`'s commit counter.
    pub(super) fn put_commits(&self, txn: &mut RwTxn, name: &str, commits: u64) -> heed::Result<()> {
        let key = format!("{COMMITS_PREFIX}{name}");
        self.0.put(txn, &key, &commits.to_le_bytes())
    }

    pub(super) fn delete_record(&self, txn: &mut RwTxn, name: &str) -> heed::Result<bool> {
        self.records().delete(txn, name)
    }
}
