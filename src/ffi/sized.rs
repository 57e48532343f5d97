//! `struct_size`: how every struct that crosses the C boundary stays extensible (the PJRT and
//! `openat2` convention), handled here and nowhere else.
//!
//! Each such struct starts with `size_t struct_size`, set to `sizeof` by its
//! `strata_<name>_default()`. Fields are only ever appended, so a caller's `struct_size` says
//! which fields it knows:
//! - **in-structs** (options the caller fills): [`read_in`] reads only the bytes the caller's
//!   size covers and takes defaults for the rest; a larger size than this library knows is
//!   accepted when the unknown tail is all zero bytes (a newer caller asking for nothing new),
//!   and refused when it is not (it asks for something this library cannot do);
//! - **out-structs** (results strata fills): [`OutStruct::write`] writes only the bytes the
//!   caller's size covers, never one past them; bytes of a larger size that this library does
//!   not know are zeroed, so a newer caller reads its new fields as 0;
//! - a size of 0, below the first published layout, or not a multiple of 8 (a struct that was
//!   never initialised) is refused with `STRATA_INVALID_ARGUMENT`, saying how to initialise it;
//! - **arrays** of in-structs (`desc->partitions`, a partition's `locations`) are read through
//!   [`in_array`]: their stride is the elements' `struct_size`, which every element of one array
//!   carries alike, and each element is read under the rules above.

use crate::error::{Error, Result};
use std::mem::size_of;

/// The largest `struct_size` accepted: far above any strata struct, and a bound on what an
/// uninitialised size can make strata read.
const MAX_STRUCT_SIZE: usize = 1024;

/// A `#[repr(C)]` struct that crosses the C boundary and starts with `size_t struct_size`.
///
/// # Safety
/// Implementors are `#[repr(C)]`, their first field is `struct_size: usize`, and every bit
/// pattern of their fields is a valid value (integers, floats, raw and optional function
/// pointers; `bool` only in out-structs, which strata never reads back).
pub(crate) unsafe trait Extensible: Copy + Default {
    /// The C name, for messages (`strata_table_options`).
    const NAME: &'static str;
    /// `sizeof` of the first published layout (strata 0.3); smaller sizes are refused.
    const FIRST_SIZE: usize;
}

/// Checks a caller's `struct_size` for `T`; `arg` names the argument in messages, and `at` the
/// element of an array it belongs to (`"partitions[3]."`, or `""` for the argument itself).
fn check_size<T: Extensible>(size: usize, arg: &'static str, at: &str) -> Result<()> {
    if size >= T::FIRST_SIZE && size <= MAX_STRUCT_SIZE && size.is_multiple_of(8) {
        return Ok(()); // the common case, without building any message
    }
    let name = T::NAME;
    let init = format!("initialise it with {name}_default(), which sets struct_size = sizeof({name})");
    if size == 0 {
        return Err(Error::invalid(arg, format!("{at}struct_size is 0; {init}")));
    }
    if size < T::FIRST_SIZE {
        return Err(Error::invalid(
            arg,
            format!("{at}struct_size = {size} is below the first published size of {name} ({} bytes); {init}", T::FIRST_SIZE),
        ));
    }
    if size > MAX_STRUCT_SIZE || !size.is_multiple_of(8) {
        return Err(Error::invalid(
            arg,
            format!("{at}struct_size = {size} is not the size of any version of {name} (this library's is {}); {init}", size_of::<T>()),
        ));
    }
    Ok(())
}

/// Reads a `T` from the `size` bytes at `p` (a size [`check_size`] accepted): the fields `size`
/// covers, defaults for the rest; a larger `size` only with a zero tail. The result's
/// `struct_size` is this library's.
///
/// # Safety
/// `p` must point to `size` readable bytes, aligned for `T`.
unsafe fn read_checked<T: Extensible>(p: *const u8, size: usize, arg: &'static str, at: &dyn Fn() -> String) -> Result<T> {
    let known = size_of::<T>();
    if size > known {
        // SAFETY: the caller vouches for `size` readable bytes at p.
        let tail = unsafe { std::slice::from_raw_parts(p.add(known), size - known) };
        if let Some(i) = tail.iter().position(|&b| b != 0) {
            return Err(Error::invalid(
                arg,
                format!(
                    "{}struct_size = {size}, and byte {} is not zero: this library's {} has {known} bytes, so the \
                     caller set a field of a newer strata that this one cannot honour (use a strata of that version, or leave the field at its default)",
                    at(),
                    known + i,
                    T::NAME
                ),
            ));
        }
    }
    let mut v = T::default();
    // SAFETY: both ranges hold at least min(size, known) bytes; T accepts any bit pattern.
    unsafe { std::ptr::copy_nonoverlapping(p, &mut v as *mut T as *mut u8, size.min(known)) };
    // SAFETY: v is a T, which starts with its usize struct_size; record the size known here.
    unsafe { (&mut v as *mut T as *mut usize).write(known) };
    Ok(v)
}

/// Reads an in-struct the caller filled, or the defaults when `p` is NULL: the fields its
/// `struct_size` covers, defaults for the rest. See the module docs for the size rules.
///
/// # Safety
/// `p` must be NULL or point to at least `struct_size` readable bytes, aligned for `T`.
pub(crate) unsafe fn read_in<T: Extensible>(p: *const T, arg: &'static str) -> Result<T> {
    if p.is_null() {
        return Ok(T::default());
    }
    // SAFETY: p is valid for reads of at least its first field, a usize (T starts with it).
    let size = unsafe { (p as *const usize).read() };
    check_size::<T>(size, arg, "")?;
    // SAFETY: the caller vouches for `size` readable bytes at p, aligned for T.
    unsafe { read_checked(p as *const u8, size, arg, &String::new) }
}

/// A C array of in-structs (`desc->partitions`): its stride is its elements' `struct_size`,
/// which every element must carry alike. [`InArray::get`] reads element `i` under the rules of
/// [`read_in`]: the fields its size covers, defaults for the rest, a larger size only with a
/// zero tail; messages name the element (`desc: partitions[3].struct_size = ...`).
pub(crate) struct InArray<T> {
    base: *const u8,
    len: usize,
    /// The elements' `struct_size` (that of element 0, checked).
    stride: usize,
    arg: &'static str,
    /// The array as messages name it, e.g. `partitions` or `partitions[2].locations`.
    name: String,
    _elements: std::marker::PhantomData<*const T>,
}

/// Checks element 0's `struct_size` of the `len` elements at `p` (nothing for `len == 0`);
/// `arg` names the argument the array belongs to and `name` the array, in messages.
///
/// # Safety
/// For `len > 0`, `p` must point to `len` elements of the size element 0's `struct_size`
/// says, aligned for `T`, readable for as long as the returned array is used.
pub(crate) unsafe fn in_array<T: Extensible>(p: *const T, len: usize, arg: &'static str, name: &str) -> Result<InArray<T>> {
    let mut a = InArray { base: p as *const u8, len, stride: 0, arg, name: name.to_string(), _elements: std::marker::PhantomData };
    if len == 0 {
        return Ok(a);
    }
    if p.is_null() {
        return Err(Error::invalid(arg, format!("{name} is NULL; expected {len} elements")));
    }
    // SAFETY: p points to element 0, which starts with its usize struct_size.
    a.stride = unsafe { (p as *const usize).read() };
    check_size::<T>(a.stride, arg, &format!("{name}[0]."))?;
    Ok(a)
}

impl<T: Extensible> InArray<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Element `i` (< `len`), read as [`read_in`] reads a struct; refused when its
    /// `struct_size` differs from element 0's, the array's stride.
    pub(crate) fn get(&self, i: usize) -> Result<T> {
        assert!(i < self.len, "element {i} of an array of {}", self.len);
        // Built only for a message: formatting it for every element would cost more than the read.
        let at = || format!("{}[{i}].", self.name);
        // SAFETY: in_array's caller vouched for len elements `stride` bytes apart, each starting
        // with its usize struct_size; the stride is a checked size, a multiple of 8.
        let (p, size) = unsafe {
            let p = self.base.add(i * self.stride);
            (p, (p as *const usize).read())
        };
        if size != self.stride {
            let name = T::NAME;
            return Err(Error::invalid(
                self.arg,
                format!(
                    "{}struct_size = {size}, but {}[0].struct_size = {}; expected the same in every element (the array's \
                     stride): initialise each with {name}_default(), which sets struct_size = sizeof({name})",
                    at(),
                    self.name,
                    self.stride
                ),
            ));
        }
        // SAFETY: element i holds `size` (= the stride) readable bytes, aligned (see above).
        unsafe { read_checked(p, size, self.arg, &at) }
    }
}

/// An out-struct whose `struct_size` was checked before any work was done; [`OutStruct::write`]
/// fills it once the results are known.
pub(crate) struct OutStruct<T> {
    p: *mut T,
    size: usize,
}

/// Checks an optional out-struct (NULL: the caller does not want it) before the call does any
/// work, so a bad `struct_size` fails the call without side effects.
///
/// # Safety
/// `p` must be NULL or point to at least `struct_size` writable bytes, aligned for `T`, that
/// stay valid until [`OutStruct::write`].
pub(crate) unsafe fn out_struct<T: Extensible>(p: *mut T, arg: &'static str) -> Result<Option<OutStruct<T>>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: p points to at least the struct's first field.
    let size = unsafe { (p as *const usize).read() };
    check_size::<T>(size, arg, "")?;
    Ok(Some(OutStruct { p, size }))
}

/// [`out_struct`] for a required out-struct.
///
/// # Safety
/// As for [`out_struct`].
pub(crate) unsafe fn out_struct_required<T: Extensible>(p: *mut T, arg: &'static str) -> Result<OutStruct<T>> {
    // SAFETY: forwarded.
    match unsafe { out_struct(p, arg) }? {
        Some(s) => Ok(s),
        None => Err(Error::Null { arg }),
    }
}

impl<T: Extensible> OutStruct<T> {
    /// Writes `v`'s fields that the caller's `struct_size` covers (its own `struct_size` stays
    /// as the caller set it) and zeroes the bytes of a larger size that this library does not
    /// know. Nothing past `struct_size` is written.
    pub(crate) fn write(self, v: &T) {
        let known = size_of::<T>();
        let head = size_of::<usize>();
        let src = v as *const T as *const u8;
        let dst = self.p as *mut u8;
        // SAFETY: out_struct checked struct_size >= FIRST_SIZE > head; the caller vouched for
        // `size` writable bytes at p, and v holds `known` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(src.add(head), dst.add(head), self.size.min(known) - head);
            if self.size > known {
                std::ptr::write_bytes(dst.add(known), 0, self.size - known);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A struct in two versions: `V2` appends `extra` to `V1`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct V2 {
        struct_size: usize,
        a: u32,
        b: f32,
        extra: u64,
    }
    impl Default for V2 {
        fn default() -> Self {
            V2 { struct_size: size_of::<V2>(), a: 7, b: 0.5, extra: 99 }
        }
    }
    // SAFETY: repr(C), starts with struct_size, all fields accept any bit pattern.
    unsafe impl Extensible for V2 {
        const NAME: &'static str = "strata_test";
        const FIRST_SIZE: usize = 16;
    }

    #[test]
    fn an_older_caller_gets_defaults_for_the_fields_it_does_not_know() {
        let old = [16usize, (3u64 | (2.0f32.to_bits() as u64) << 32) as usize, 0xdead_beef];
        // SAFETY: `old` holds 24 readable bytes, more than the 16 its struct_size claims.
        let v = unsafe { read_in(old.as_ptr() as *const V2, "opts") }.unwrap();
        assert_eq!(v, V2 { struct_size: 24, a: 3, b: 2.0, extra: 99 });
    }

    #[test]
    fn a_newer_caller_is_accepted_only_with_a_zero_tail() {
        let mut newer = [32usize, 1, 5, 0];
        // SAFETY: 32 readable bytes.
        let v = unsafe { read_in(newer.as_ptr() as *const V2, "opts") }.unwrap();
        assert_eq!((v.a, v.extra), (1, 5));
        newer[3] = 1;
        // SAFETY: 32 readable bytes.
        let e = unsafe { read_in(newer.as_ptr() as *const V2, "opts") }.unwrap_err().to_string();
        assert!(e.starts_with("opts: struct_size = 32, and byte 24 is not zero"), "{e}");
    }

    #[test]
    fn sizes_that_were_never_initialised_are_refused() {
        for (size, want) in [
            (0usize, "opts: struct_size is 0; initialise it with strata_test_default()"),
            (8, "opts: struct_size = 8 is below the first published size of strata_test (16 bytes)"),
            (20, "opts: struct_size = 20 is not the size of any version of strata_test"),
            (1 << 20, "opts: struct_size = 1048576 is not the size of any version"),
        ] {
            let raw = [size, 0, 0, 0];
            // SAFETY: 32 readable bytes, and no size above is accepted to read more.
            let e = unsafe { read_in(raw.as_ptr() as *const V2, "opts") }.unwrap_err().to_string();
            assert!(e.starts_with(want), "{e}");
        }
    }

    #[test]
    fn out_structs_are_written_up_to_their_size_only() {
        let v = V2 { struct_size: 24, a: 1, b: 1.0, extra: 2 };
        let mut old = [16usize, usize::MAX, usize::MAX];
        // SAFETY: 24 writable bytes, 16 claimed.
        unsafe { out_struct(old.as_mut_ptr() as *mut V2, "stats") }.unwrap().unwrap().write(&v);
        assert_eq!(old[0], 16);
        assert_eq!(old[1], (1u64 | (1.0f32.to_bits() as u64) << 32) as usize);
        assert_eq!(old[2], usize::MAX, "the byte past struct_size was written");
        let mut newer = [32usize, 0, 0, usize::MAX, usize::MAX];
        // SAFETY: 40 writable bytes, 32 claimed.
        unsafe { out_struct(newer.as_mut_ptr() as *mut V2, "stats") }.unwrap().unwrap().write(&v);
        assert_eq!(&newer[..], &[32, old[1], 2, 0, usize::MAX]);
    }

    #[test]
    fn arrays_are_strided_by_their_elements_struct_size() {
        // Older elements: 16 bytes apart, the fields they lack are defaults.
        let old = [16usize, 3, 16, 4];
        // SAFETY: two 16-byte elements.
        let a = unsafe { in_array(old.as_ptr() as *const V2, 2, "desc", "items") }.unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a.get(1).unwrap(), V2 { struct_size: 24, a: 4, b: 0.0, extra: 99 });
        // Newer elements: 32 bytes apart, accepted with zero tails.
        let mut newer = [32usize, 1, 5, 0, 32, 2, 6, 0];
        // SAFETY: two 32-byte elements.
        let a = unsafe { in_array(newer.as_ptr() as *const V2, 2, "desc", "items") }.unwrap();
        assert_eq!((a.get(0).unwrap().a, a.get(1).unwrap().a, a.get(1).unwrap().extra), (1, 2, 6));
        newer[7] = 1;
        // SAFETY: as above.
        let a = unsafe { in_array(newer.as_ptr() as *const V2, 2, "desc", "items") }.unwrap();
        let e = a.get(1).unwrap_err().to_string();
        assert!(e.starts_with("desc: items[1].struct_size = 32, and byte 24 is not zero"), "{e}");
        assert!(a.get(0).is_ok());
    }

    #[test]
    fn every_element_of_an_array_carries_the_same_size() {
        let mixed = [24usize, 1, 7, 16, 2, 0];
        // SAFETY: element 0 holds 24 bytes; element 1 claims 16 of the 24 left.
        let a = unsafe { in_array(mixed.as_ptr() as *const V2, 2, "desc", "partitions[2].locations") }.unwrap();
        assert_eq!(a.get(0).unwrap().extra, 7);
        let e = a.get(1).unwrap_err().to_string();
        assert!(e.starts_with("desc: partitions[2].locations[1].struct_size = 16, but partitions[2].locations[0].struct_size = 24"), "{e}");
        assert!(e.contains("initialise each with strata_test_default()"), "{e}");
    }

    #[test]
    fn array_sizes_that_were_never_initialised_are_refused() {
        for (size, want) in [
            (0usize, "desc: partitions[0].struct_size is 0; initialise it with strata_test_default()"),
            (8, "desc: partitions[0].struct_size = 8 is below the first published size of strata_test"),
            (0xdead_beef, "desc: partitions[0].struct_size = 3735928559 is not the size of any version"),
        ] {
            let raw = [size, 0, 0, 0];
            // SAFETY: 32 readable bytes; no size above is accepted to read more.
            let e = unsafe { in_array(raw.as_ptr() as *const V2, 1, "desc", "partitions") }.err().unwrap().to_string();
            assert!(e.starts_with(want), "{e}");
        }
        // An element after the first with a size that was never initialised differs from the stride.
        let raw = [16usize, 0, 0, 0];
        // SAFETY: two 16-byte elements.
        let a = unsafe { in_array(raw.as_ptr() as *const V2, 2, "desc", "partitions") }.unwrap();
        assert!(a.get(1).unwrap_err().to_string().starts_with("desc: partitions[1].struct_size = 0, but partitions[0].struct_size = 16"));
        // An empty array reads nothing, not even its (NULL) pointer; a NULL non-empty one is refused.
        // SAFETY: nothing is read.
        assert_eq!(unsafe { in_array(std::ptr::null::<V2>(), 0, "desc", "partitions") }.unwrap().len(), 0);
        // SAFETY: NULL is checked before any read.
        let e = unsafe { in_array(std::ptr::null::<V2>(), 2, "desc", "partitions") }.err().unwrap().to_string();
        assert_eq!(e, "desc: partitions is NULL; expected 2 elements");
    }
}
