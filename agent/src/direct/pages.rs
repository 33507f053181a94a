//! PostgreSQL's page formats, for the pages a direct load writes: the page
//! header, line pointers, the data checksum, pgbench_accounts' heap tuples
//! and the visibility map. Only what pgbench's accounts need; every layout
//! rule here is checked against the server's own pages before a build is
//! trusted (`check.rs`).
//!
//! Layouts (little-endian, 8 KiB blocks, MAXALIGN 8):
//! - page header, 24 bytes: pd_lsn u64, pd_checksum u16, pd_flags u16,
//!   pd_lower u16, pd_upper u16, pd_special u16, pd_pagesize_version u16,
//!   pd_prune_xid u32; then the line pointers (u32: offset 15 bits, flags 2,
//!   length 15), the free space, the items from the end down, the special
//!   space;
//! - heap tuple header, 23 bytes padded to 24: xmin, xmax, cid (u32 each),
//!   ctid (block hi u16, block lo u16, offset u16), infomask2 u16,
//!   infomask u16, hoff u8.

pub const BLCKSZ: usize = 8192;
pub const PAGE_HEADER: usize = 24;
const LAYOUT_VERSION: u16 = 4;
const LP_NORMAL: u32 = 1;
/// pd_flags: every tuple on the page is visible to everyone.
const PD_ALL_VISIBLE: u16 = 0x0004;

/// A page's bytes.
pub type Page = [u8; BLCKSZ];

pub fn maxalign(n: usize) -> usize {
    (n + 7) & !7
}

pub fn get_u16(p: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([p[at], p[at + 1]])
}
pub fn put_u16(p: &mut [u8], at: usize, v: u16) {
    p[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
pub fn get_u32(p: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(p[at..at + 4].try_into().unwrap())
}
pub fn put_u32(p: &mut [u8], at: usize, v: u32) {
    p[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn lower(p: &Page) -> usize {
    get_u16(p, 12) as usize
}
pub fn set_lower(p: &mut Page, v: usize) {
    put_u16(p, 12, v as u16)
}
pub fn upper(p: &Page) -> usize {
    get_u16(p, 14) as usize
}
pub fn set_upper(p: &mut Page, v: usize) {
    put_u16(p, 14, v as u16)
}
pub fn special(p: &Page) -> usize {
    get_u16(p, 16) as usize
}

/// PageInit: a zeroed page with `special_size` bytes of special space.
pub fn init(p: &mut Page, special_size: usize) {
    p.fill(0);
    let special = BLCKSZ - maxalign(special_size);
    set_lower(p, PAGE_HEADER);
    set_upper(p, special);
    put_u16(p, 16, special as u16);
    put_u16(p, 18, BLCKSZ as u16 | LAYOUT_VERSION);
}

/// Line pointer `off` (1-based): (item offset, item length).
pub fn item(p: &Page, off: usize) -> (usize, usize) {
    let lp = get_u32(p, PAGE_HEADER + 4 * (off - 1));
    ((lp & 0x7fff) as usize, (lp >> 17) as usize)
}
pub fn set_item(p: &mut Page, off: usize, at: usize, len: usize) {
    let lp = at as u32 | (LP_NORMAL << 15) | ((len as u32) << 17);
    put_u32(p, PAGE_HEADER + 4 * (off - 1), lp);
}
pub fn max_offset(p: &Page) -> usize {
    (lower(p) - PAGE_HEADER) / 4
}

/// PageGetFreeSpace: the gap, less one line pointer.
pub fn free_space(p: &Page) -> usize {
    (upper(p) as isize - lower(p) as isize - 4).max(0) as usize
}

/// PageAddItem appending at the next offset: the item's bytes below
/// pd_upper (MAXALIGNed room, `item.len()` bytes copied).
pub fn append(p: &mut Page, item: &[u8]) -> usize {
    let off = max_offset(p) + 1;
    let at = upper(p) - maxalign(item.len());
    p[at..at + item.len()].copy_from_slice(item);
    set_item(p, off, at, item.len());
    set_lower(p, lower(p) + 4);
    set_upper(p, at);
    off
}

/// N_SUMS columns of FNV-1a-like hashes, each seeded differently: the
/// initial values of PostgreSQL's page checksum (storage/checksum_impl.h).
const CHECKSUM_SEEDS: [u32; 32] = [
    0x5B1F36E9, 0xB8525960, 0x02AB50AA, 0x1DE66D2A, 0x79FF467A, 0x9BB9F8A3, 0x217E7CD2, 0x83E13D2C,
    0xF8D4474F, 0xE39EB970, 0x42C6AE16, 0x993216FA, 0x7B093B5D, 0x98DAFF3C, 0xF718902A, 0x0B1C9CDB,
    0xE58F764B, 0x187636BC, 0x5D7B3BB1, 0xE73DE7DE, 0x92BEC979, 0xCCA6C0B2, 0x304A0979, 0x85AA43D4,
    0x783125BB, 0x6CA8EAA2, 0xE407EAC6, 0x4B5CFC3E, 0x9FBF8C76, 0x15CA20BE, 0xF2CA9FD3, 0x959BD756,
];

/// The data checksum of page `blkno` of a fork (its number in the fork,
/// across segments), as the server computes it with pd_checksum taken as 0.
pub fn checksum(p: &Page, blkno: u32) -> u16 {
    const PRIME: u32 = 16_777_619;
    #[inline(always)]
    fn mix(sum: u32, v: u32) -> u32 {
        let t = sum ^ v;
        t.wrapping_mul(PRIME) ^ (t >> 17)
    }
    let mut sums = CHECKSUM_SEEDS;
    for (row, chunk) in p.chunks_exact(128).enumerate() {
        for (j, s) in sums.iter_mut().enumerate() {
            let mut v = get_u32(chunk, 4 * j);
            if row == 0 && j == 2 {
                // pd_checksum, the low half of the third word, counts as 0.
                v &= 0xffff_0000;
            }
            *s = mix(*s, v);
        }
    }
    let mut folded = 0u32;
    for s in sums {
        folded ^= mix(mix(s, 0), 0);
    }
    (((folded ^ blkno) % 65_535) + 1) as u16
}

pub fn stored_checksum(p: &Page) -> u16 {
    get_u16(p, 8)
}

/// Sets pd_checksum (when the cluster has checksums) for block `blkno`.
pub fn seal(p: &mut Page, blkno: u32, checksums: bool) {
    if checksums {
        put_u16(p, 8, 0);
        let c = checksum(p, blkno);
        put_u16(p, 8, c);
    }
}

/// pgbench_accounts as pgbench loads it with `COPY ... FREEZE`: rows
/// `lo..=hi` (aid, bid = (aid - 1) / 100,000 + 1, abalance 0, filler 84
/// blanks) in aid order, frozen, every page all-visible.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Accounts {
    pub lo: u64,
    pub hi: u64,
    /// `aid` is bigint (pgbench from scale 20,000).
    pub bigint: bool,
    pub fillfactor: u32,
}

/// infomask: a varlena attribute; xmin committed and invalid (= frozen);
/// xmax invalid.
const HEAP_INFOMASK: u16 = 0x0002 | 0x0300 | 0x0800;
/// FrozenTransactionId: the xmin of rows frozen since they were written.
pub const FROZEN_XID: u32 = 2;
/// The filler: char(84), empty in pgbench's COPY, blank-padded, stored as a
/// short varlena (1-byte header: (84 + 1) << 1 | 1).
const FILLER: usize = 84;

impl Accounts {
    pub fn rows(&self) -> u64 {
        self.hi + 1 - self.lo
    }

    /// The tuple's length (header, aid, bid, abalance, filler).
    pub fn tuple_len(&self) -> usize {
        24 + if self.bigint { 8 } else { 4 } + 4 + 4 + 1 + FILLER
    }

    /// Rows per page: heap_multi_insert puts a row on the page while the
    /// page's heap free space is at least the row's aligned length plus
    /// what the fillfactor keeps free (the first row on a page always).
    pub fn per_page(&self) -> u64 {
        let save = BLCKSZ * (100 - self.fillfactor as usize) / 100;
        let need = maxalign(self.tuple_len()) + save;
        let mut n = 1usize;
        loop {
            let lower = PAGE_HEADER + 4 * n;
            let upper = BLCKSZ - maxalign(self.tuple_len()) * n;
            let free = (upper as isize - lower as isize - 4).max(0) as usize;
            if free < need {
                return n as u64;
            }
            n += 1;
        }
    }

    pub fn pages(&self) -> u64 {
        self.rows().div_ceil(self.per_page())
    }

    /// The heap TID of `aid`: (block, offset).
    pub fn tid(&self, aid: u64) -> (u32, u16) {
        let i = aid - self.lo;
        let pp = self.per_page();
        ((i / pp) as u32, (i % pp + 1) as u16)
    }

    /// Heap page `blk` (checksummed when `checksums`).
    pub fn heap_page(&self, blk: u64, checksums: bool, p: &mut Page) {
        init(p, 0);
        put_u16(p, 10, PD_ALL_VISIBLE);
        let pp = self.per_page();
        let first = self.lo + blk * pp;
        let last = (first + pp - 1).min(self.hi);
        let len = self.tuple_len();
        let room = maxalign(len);
        let mut tuple = [0u8; 128];
        put_u32(&mut tuple, 0, FROZEN_XID);
        put_u16(&mut tuple, 12, (blk >> 16) as u16);
        put_u16(&mut tuple, 14, blk as u16);
        put_u16(&mut tuple, 18, 4);
        put_u16(&mut tuple, 20, HEAP_INFOMASK);
        tuple[22] = 24;
        let (bid_at, filler_at) = if self.bigint { (32, 40) } else { (28, 36) };
        tuple[filler_at] = (((FILLER + 1) << 1) | 1) as u8;
        tuple[filler_at + 1..filler_at + 1 + FILLER].fill(b' ');
        let n = (last + 1 - first) as usize;
        for (k, aid) in (first..=last).enumerate() {
            put_u16(&mut tuple, 16, (k + 1) as u16);
            if self.bigint {
                tuple[24..32].copy_from_slice(&aid.to_le_bytes());
            } else {
                tuple[24..28].copy_from_slice(&(aid as u32).to_le_bytes());
            }
            let bid = ((aid - 1) / 100_000 + 1) as u32;
            put_u32(&mut tuple, bid_at, bid);
            let at = BLCKSZ - room * (k + 1);
            p[at..at + len].copy_from_slice(&tuple[..len]);
            set_item(p, k + 1, at, len);
        }
        set_lower(p, PAGE_HEADER + 4 * n);
        set_upper(p, BLCKSZ - room * n);
        seal(p, blk as u32, checksums);
    }
}

/// Heap blocks one visibility map page covers (2 bits each).
pub const VM_BLOCKS_PER_PAGE: u64 = ((BLCKSZ - PAGE_HEADER) * 4) as u64;

/// The visibility map of `heap_pages` pages, every one all-visible and
/// all-frozen: its page `vm_blk`.
pub fn vm_page(heap_pages: u64, vm_blk: u64, checksums: bool, p: &mut Page) {
    init(p, 0);
    let first = vm_blk * VM_BLOCKS_PER_PAGE;
    let here = heap_pages.saturating_sub(first).min(VM_BLOCKS_PER_PAGE) as usize;
    let full = here / 4;
    p[PAGE_HEADER..PAGE_HEADER + full].fill(0xff);
    if !here.is_multiple_of(4) {
        p[PAGE_HEADER + full] = ((1u16 << (2 * (here % 4))) - 1) as u8;
    }
    seal(p, vm_blk as u32, checksums);
}

pub fn vm_pages(heap_pages: u64) -> u64 {
    heap_pages.div_ceil(VM_BLOCKS_PER_PAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pgbench's figures: 61 rows per page at fillfactor 100 (1,640 pages
    /// per scale unit), the tuple 121 bytes (125 with a bigint aid).
    #[test]
    fn accounts_fill_pages_as_pgbench() {
        let a = Accounts {
            lo: 1,
            hi: 100_000,
            bigint: false,
            fillfactor: 100,
        };
        assert_eq!((a.tuple_len(), a.per_page(), a.pages()), (121, 61, 1640));
        let b = Accounts { bigint: true, ..a };
        assert_eq!((b.tuple_len(), b.per_page()), (125, 61));
        let ff90 = Accounts {
            fillfactor: 90,
            ..a
        };
        assert_eq!(ff90.per_page(), 55);
        assert_eq!(a.tid(1), (0, 1));
        assert_eq!(a.tid(62), (1, 1));
        let mut p = [0u8; BLCKSZ];
        a.heap_page(1639, true, &mut p);
        // 100,000 - 1,639 x 61 rows on the last page.
        assert_eq!(max_offset(&p), 21);
        assert_eq!(free_space(&p), BLCKSZ - PAGE_HEADER - 21 * 132 - 4);
    }

    /// The visibility map's bits: two per heap page, the last byte partial.
    #[test]
    fn the_visibility_map_marks_every_page() {
        let mut p = [0u8; BLCKSZ];
        vm_page(6, 0, false, &mut p);
        assert_eq!(&p[24..27], &[0xff, 0x0f, 0]);
        assert_eq!(vm_pages(VM_BLOCKS_PER_PAGE + 1), 2);
        vm_page(VM_BLOCKS_PER_PAGE + 1, 1, false, &mut p);
        assert_eq!(&p[24..26], &[0x03, 0]);
    }

    /// A checksum changes with the block number and the contents, and is
    /// never 0; the stored checksum does not feed itself.
    #[test]
    fn checksums_cover_the_page_and_its_block() {
        let mut p = [0u8; BLCKSZ];
        init(&mut p, 0);
        let c0 = checksum(&p, 0);
        assert_ne!(c0, 0);
        assert_ne!(c0, checksum(&p, 1));
        seal(&mut p, 0, true);
        assert_eq!(stored_checksum(&p), c0);
        assert_eq!(checksum(&p, 0), c0);
        p[100] = 1;
        assert_ne!(checksum(&p, 0), c0);
    }
}
