//! Appending big items without pulling their destination into the CPU caches.
//!
//! A runner records every vector step's observations into the episodes' columns and does
//! not read them again until the episode is handed over. For big items (an 84x84x4 image
//! is 28 KB, 225 KB per vector step of 8 sub-envs) an ordinary copy first reads every
//! destination line into the cache and then leaves the cache full of bytes nobody reads
//! soon, evicting the interpreter's and torch's working set: everything else in the step
//! gets slower. Non-temporal stores write around the cache. On the image runner this took
//! 2.6-3.9 µs off an env step of about 60 (alternated in one process).

/// Items at least this big are appended with non-temporal stores; smaller ones (a
/// CartPole observation, an action) with an ordinary copy, which is cheaper for them.
pub const STREAM_MIN_BYTES: usize = 4096;

/// Appends `src` to `buf` (non-temporal stores for `src` of [`STREAM_MIN_BYTES`] or more
/// on x86-64; an ordinary copy otherwise).
#[inline]
pub fn extend(buf: &mut Vec<u8>, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if src.len() >= STREAM_MIN_BYTES {
        extend_streaming(buf, src);
        return;
    }
    // The usual scalar and small-vector sizes as fixed-size copies (a few moves, where a
    // copy of unknown length calls `memcpy`: about a twentieth of a multi-agent step's
    // store, four small items per agent).
    match src.len() {
        4 => buf.extend_from_slice(&<[u8; 4]>::try_from(src).unwrap_or_default()),
        8 => buf.extend_from_slice(&<[u8; 8]>::try_from(src).unwrap_or_default()),
        16 => buf.extend_from_slice(&<[u8; 16]>::try_from(src).unwrap_or_default()),
        _ => buf.extend_from_slice(src),
    }
}

/// Appends `src` (4, 8 or 16 bytes: a scalar or a small vector item) if `buf` has room
/// for it, with fixed-size moves and no call; false (nothing appended) otherwise.
#[inline]
pub fn extend_within_capacity(buf: &mut Vec<u8>, src: &[u8]) -> bool {
    fn put<const N: usize>(buf: &mut Vec<u8>, src: &[u8]) -> bool {
        let len = buf.len();
        let Ok(bytes) = <&[u8; N]>::try_from(src) else { return false };
        if buf.capacity() - len < N {
            return false;
        }
        // SAFETY: the buffer has room for `N` more bytes (checked above); they are written
        // (one unaligned move) before the length covers them.
        unsafe {
            buf.as_mut_ptr().add(len).cast::<[u8; N]>().write_unaligned(*bytes);
            buf.set_len(len + N);
        }
        true
    }
    match src.len() {
        4 => put::<4>(buf, src),
        8 => put::<8>(buf, src),
        16 => put::<16>(buf, src),
        _ => false,
    }
}

/// The big-item half of [`extend`], kept out of line so that small appends stay a plain
/// `extend_from_slice` where they are inlined.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn extend_streaming(buf: &mut Vec<u8>, src: &[u8]) {
    buf.reserve(src.len());
    // SAFETY: `reserve` made room for `src.len()` bytes after `len`, which `src` (a
    // separate borrow) cannot overlap; the copy writes exactly those bytes before
    // `set_len` exposes them.
    unsafe {
        let len = buf.len();
        stream_copy(buf.as_mut_ptr().add(len), src.as_ptr(), src.len());
        buf.set_len(len + src.len());
    }
}

/// Copies `n` bytes with SSE2 non-temporal stores (16-byte aligned ones; the unaligned
/// head and the tail are copied as usual), then fences so that the bytes are visible as
/// ordinary stores would be.
///
/// # Safety
/// `src` must be valid for `n` reads and `dst` for `n` writes, and they must not overlap.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::cast_ptr_alignment)] // loads are unaligned (loadu); stores aligned by `head`
unsafe fn stream_copy(dst: *mut u8, src: *const u8, n: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // SAFETY: every access below is within `src[..n]` / `dst[..n]` (the caller's
    // guarantee); the stores are aligned because `dst + head` is 16-byte aligned; SSE2 is
    // part of x86-64.
    unsafe {
        let head = dst.align_offset(16).min(n);
        std::ptr::copy_nonoverlapping(src, dst, head);
        let mut i = head;
        while i + 64 <= n {
            let s = src.add(i).cast::<__m128i>();
            let d = dst.add(i).cast::<__m128i>();
            let (a, b, c, e) = (
                _mm_loadu_si128(s),
                _mm_loadu_si128(s.add(1)),
                _mm_loadu_si128(s.add(2)),
                _mm_loadu_si128(s.add(3)),
            );
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
            i += 64;
        }
        while i + 16 <= n {
            _mm_stream_si128(dst.add(i).cast::<__m128i>(), _mm_loadu_si128(src.add(i).cast::<__m128i>()));
            i += 16;
        }
        std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), n - i);
        _mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_a_small_item_only_where_it_fits_the_room_left() {
        for n in [4usize, 8, 16] {
            let src: Vec<u8> = (1..=n as u8).collect();
            let mut buf: Vec<u8> = Vec::with_capacity(3 + n);
            buf.extend_from_slice(&[9, 9, 9]);
            assert!(extend_within_capacity(&mut buf, &src), "{n} bytes fit");
            assert_eq!(buf[3..], src[..]);
            assert_eq!(buf.len(), 3 + n);
            buf.shrink_to_fit();
            let before = buf.clone();
            if buf.capacity() == buf.len() {
                assert!(!extend_within_capacity(&mut buf, &src), "no room: nothing appended");
                assert_eq!(buf, before);
            }
        }
        let mut buf = Vec::with_capacity(64);
        assert!(!extend_within_capacity(&mut buf, &[1, 2, 3]), "other sizes take the general copy");
        assert!(buf.is_empty());
    }

    #[test]
    fn appends_the_same_bytes_as_an_ordinary_copy() {
        let src: Vec<u8> = (0..70_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        // Every alignment of the destination, sizes around the threshold and the 64- and
        // 16-byte steps, and sources that start unaligned.
        for prefix in 0..17 {
            for &n in &[0, 1, 15, 4095, 4096, 4097, 4096 + 63, 4096 + 64 + 15, 28_224, 70_000 - 17] {
                for &offset in &[0usize, 1, 7] {
                    let part = &src[offset..offset + n.min(src.len() - offset)];
                    let mut got: Vec<u8> = vec![0xAB; prefix];
                    let mut want = got.clone();
                    extend(&mut got, part);
                    want.extend_from_slice(part);
                    assert_eq!(got, want, "prefix {prefix}, n {n}, offset {offset}");
                    // Appending again after the streamed bytes.
                    extend(&mut got, part);
                    want.extend_from_slice(part);
                    assert_eq!(got, want);
                }
            }
        }
    }
}
