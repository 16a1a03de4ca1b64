//! Host bytes a caller lends to a host-memory device for the life of a
//! [`BorrowedInput`](crate::BorrowedInput): the one `unsafe` of this crate.
//!
//! A [`LentBytes`] is a raw view of a `&'a [T]` (`T: Element`, plain old data). Only
//! [`host::lend`](crate::host) builds one, and it puts it at once into a `BorrowedInput<'a>`, which
//! borrows the slice for `'a` and hands out its buffer only as `&Buffer`. So the view is never
//! read after the slice's borrow ends (the buffer drops with the `BorrowedInput`), and never written
//! (no `&mut Buffer` to it exists: the host memory refuses a mutable view of lent bytes).

use std::ptr::NonNull;

/// A shared, read-only view of `len` bytes the caller lent.
#[derive(Debug)]
pub(crate) struct LentBytes {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `LentBytes` is a shared view of a `&[T]` with `T: Element` (`Pod`, hence `Sync`):
// sending it to, or reading it from, another thread is what sharing that `&[T]` allows, and
// nothing writes through it.
unsafe impl Send for LentBytes {}
// SAFETY: as for `Send`: only shared reads of plain old data, which `&[T]: Sync` allows.
unsafe impl Sync for LentBytes {}

impl LentBytes {
    /// A view of `bytes`. The caller (`host::lend`) ties the view's use to the borrow of `bytes`.
    pub(crate) fn new(bytes: &[u8]) -> Self {
        LentBytes {
            ptr: NonNull::from(bytes).cast(),
            len: bytes.len(),
        }
    }

    /// The lent bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` and `len` come from a `&[u8]` that is still borrowed: the only owner of a
        // `LentBytes` is the buffer inside a `BorrowedInput<'a>` that borrows the slice for `'a`, and
        // `&self` cannot outlive that `BorrowedInput`. Nothing writes to the slice meanwhile (it is
        // shared-borrowed, and this crate gives no mutable view of lent bytes).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}
