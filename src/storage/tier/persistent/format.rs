//! The on-disk format: every byte layout the store writes, as typed heed codecs.
//!
//! Inside LMDB's `data.mdb`:
//! - the named database [`META_DB`] (the [`Catalog`]) maps
//!   - the key [`FORMAT_KEY`] to [`FORMAT`] (the layout version), and
//!   - each table name (UTF-8, e.g. `wdl/table0`) to a 16-byte [`TableRecord`]
//!     `[layout u32 LE = 1][state u32 LE: 0 = loading, 1 = complete][dim u64 LE]`, and
//!   - [`COMMITS_PREFIX`]`<name>` to the table's commit counter (`u64` LE, absent = 0): every
//!     upsert and every erase that removed a row adds 1 inside its own write transaction, so
//!     other processes sharing the store notice that the table changed;
//! - each table is the named database [`TABLE_PREFIX`]`<name>` ([`Rows`]): key = the canonical
//!   64-bit key (the bit pattern of HugeCTR's int64) as 8 **big-endian** bytes ([`BeKey`]), so
//!   LMDB's byte order is numeric `u64` order; value = the row as `dim` little-endian float32
//!   ([`LeRow`], `dim * 4` bytes, checked on every read).
//!
//! Stored bytes that do not decode are reported as [`Corrupt`], whose message the store errors
//! carry as they are.

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
const RECORD_LAYOUT: u32 = 1;
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

/// A row in its stored encoding: float32 values, little-endian, back to back. The encoding of
/// HugeCTR's `emb_vector` too, so a sparse folder's rows are stored as they are. Borrowed (from
/// the caller, a sparse file or LMDB's map); its length is checked when it is read.
#[derive(Clone, Copy)]
pub(super) struct LeRow<'a>(&'a [u8]);

impl<'a> LeRow<'a> {
    /// Rows already in this encoding (a sparse folder's `emb_vector` rows).
    pub(super) fn from_le_bytes(bytes: &'a [u8]) -> Self {
        LeRow(bytes)
    }

    /// Encodes `values` into `buf` (cleared first, and reused from row to row).
    pub(super) fn encode(values: &[f32], buf: &'a mut Vec<u8>) -> Self {
        buf.clear();
        buf.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        LeRow(buf)
    }

    /// Decodes the row of `key` into `out`, which must be exactly the row's size: a stored row of
    /// any other length is [`Corrupt`].
    pub(super) fn decode_into(self, key: u64, out: &mut [f32]) -> Result<(), Corrupt> {
        if self.0.len() != out.len() * 4 {
            return Err(Corrupt(format!(
                "corrupt row for key {key}: {} bytes; expected {} ({} float32)",
                self.0.len(),
                out.len() * 4,
                out.len()
            )));
        }
        for (o, c) in out.iter_mut().zip(self.0.chunks_exact(4)) {
            *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
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
}

impl TableRecord {
    fn encode(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&RECORD_LAYOUT.to_le_bytes());
        let state = if self.complete { STATE_COMPLETE } else { STATE_LOADING };
        b[4..8].copy_from_slice(&state.to_le_bytes());
        b[8..16].copy_from_slice(&self.dim.to_le_bytes());
        b
    }

    fn decode(v: &[u8]) -> Result<TableRecord, Corrupt> {
        let corrupt = |why: String| Corrupt(format!("corrupt metadata record: {why}"));
        let Ok(v) = <&[u8; 16]>::try_from(v) else {
            return Err(corrupt(format!("{} bytes; expected 16", v.len())));
        };
        let word = |at: usize| u32::from_le_bytes([v[at], v[at + 1], v[at + 2], v[at + 3]]);
        let layout = word(0);
        if layout != RECORD_LAYOUT {
            return Err(corrupt(format!("layout {layout}; this strata reads layout {RECORD_LAYOUT}")));
        }
        let complete = match word(4) {
            STATE_LOADING => false,
            STATE_COMPLETE => true,
            s => return Err(corrupt(format!("state {s}; expected 0 (loading) or 1 (complete)"))),
        };
        let mut dim = [0u8; 8];
        dim.copy_from_slice(&v[8..16]);
        Ok(TableRecord { complete, dim: u64::from_le_bytes(dim) })
    }
}

/// The value codec of a catalog record.
pub(super) enum RecordCodec {}

impl<'a> BytesEncode<'a> for RecordCodec {
    type EItem = TableRecord;

    fn bytes_encode(record: &'a TableRecord) -> Result<Cow<'a, [u8]>, BoxedError> {
        Ok(Cow::Owned(record.encode().to_vec()))
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
