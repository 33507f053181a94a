//! pgbench_accounts' primary key as CREATE INDEX builds it (nbtree's
//! bottom-up build, version 4): leaves filled to the index's fillfactor
//! (90 %), internal pages to 70 %, each page's high key the next page's
//! first key (its heap TID truncated away), a minus-infinity first item on
//! internal pages, siblings linked, blocks numbered in the order the build
//! allocates them (a parent's page right after the child that created it),
//! the metapage last at block 0.
//!
//! The same sequence of page decisions as the server's build, so the pages
//! are the same bytes (checked per build in `check.rs`); only the items'
//! keys and TIDs come from pgbench's rows.

use super::pages::{
    self, BLCKSZ, Page, append, free_space, get_u16, item, max_offset, put_u16, put_u32, set_item,
    set_lower,
};

const P_HIKEY: usize = 1;
const P_FIRSTKEY: usize = 2;
/// BTPageOpaqueData: prev, next, level (u32), flags, cycle id (u16).
const SPECIAL: usize = 16;
const BTP_LEAF: u16 = 1;
const BTP_ROOT: u16 = 2;
const BTP_META: u16 = 8;
/// t_info: the tuple is a pivot; its TID's offset holds the key count.
const ALT_TID: u16 = 0x2000;
const LEAF_FREE: usize = BLCKSZ * (100 - 90) / 100;
const INTERNAL_FREE: usize = BLCKSZ * (100 - 70) / 100;

/// An index tuple: TID (block hi, block lo, offset), t_info, the key.
fn leaf_tuple(key: u64, bigint: bool, tid: (u32, u16)) -> [u8; 16] {
    let mut t = [0u8; 16];
    put_u16(&mut t, 0, (tid.0 >> 16) as u16);
    put_u16(&mut t, 2, tid.0 as u16);
    put_u16(&mut t, 4, tid.1);
    put_u16(&mut t, 6, 16);
    if bigint {
        t[8..16].copy_from_slice(&key.to_le_bytes());
    } else {
        t[8..12].copy_from_slice(&(key as u32).to_le_bytes());
    }
    t
}

fn set_downlink(t: &mut [u8], blk: u32) {
    put_u16(t, 0, (blk >> 16) as u16);
    put_u16(t, 2, blk as u16);
}

/// A pivot keeping `natts` key attributes and no heap TID.
fn set_natts(t: &mut [u8], natts: u16) {
    let info = get_u16(t, 6) | ALT_TID;
    put_u16(t, 6, info);
    put_u16(t, 4, natts);
}

fn minus_infinity(from: &[u8]) -> Vec<u8> {
    let mut t = from[..8].to_vec();
    put_u16(&mut t, 6, 8);
    set_natts(&mut t, 0);
    t
}

fn opaque_at() -> usize {
    BLCKSZ - SPECIAL
}
fn set_prev(p: &mut Page, v: u32) {
    put_u32(p, opaque_at(), v)
}
fn set_next(p: &mut Page, v: u32) {
    put_u32(p, opaque_at() + 4, v)
}
fn flags(p: &Page) -> u16 {
    get_u16(p, opaque_at() + 12)
}
fn set_flags(p: &mut Page, v: u16) {
    put_u16(p, opaque_at() + 12, v)
}

fn new_page(level: u32) -> Box<Page> {
    let mut p = Box::new([0u8; BLCKSZ]);
    pages::init(&mut p, SPECIAL);
    put_u32(&mut p[..], opaque_at() + 8, level);
    set_flags(&mut p, if level == 0 { BTP_LEAF } else { 0 });
    // The high key's line pointer, reserved.
    let lower = pages::lower(&p);
    set_lower(&mut p, lower + 4);
    p
}

struct Level {
    page: Box<Page>,
    blkno: u32,
    lowkey: Option<Vec<u8>>,
    last_off: usize,
    full: usize,
}

/// Builds the index from its items in key order; finished pages go to
/// `sink(block, page)` (to be checksummed and written), in the order the
/// server's build writes them.
pub struct Builder<S: FnMut(u32, &mut Page) -> std::io::Result<()>> {
    levels: Vec<Level>,
    alloced: u32,
    sink: S,
}

impl<S: FnMut(u32, &mut Page) -> std::io::Result<()>> Builder<S> {
    pub fn new(sink: S) -> Self {
        Builder {
            levels: Vec::new(),
            // Block 0 is the metapage's.
            alloced: 1,
            sink,
        }
    }

    fn level(&mut self, level: usize) {
        self.levels.push(Level {
            page: new_page(level as u32),
            blkno: self.alloced,
            lowkey: None,
            last_off: P_HIKEY,
            full: if level > 0 { INTERNAL_FREE } else { LEAF_FREE },
        });
        self.alloced += 1;
    }

    /// The next key of the leaf level, with its heap TID.
    pub fn push(&mut self, key: u64, bigint: bool, tid: (u32, u16)) -> std::io::Result<()> {
        if self.levels.is_empty() {
            self.level(0);
        }
        self.add(0, &leaf_tuple(key, bigint, tid))
    }

    fn add(&mut self, lvl: usize, itup: &[u8]) -> std::io::Result<()> {
        let isleaf = lvl == 0;
        let size = pages::maxalign(itup.len());
        let (pgspc, last_off, full) = {
            let s = &self.levels[lvl];
            (free_space(&s.page), s.last_off, s.full)
        };
        let mut last_off = last_off;
        if pgspc < size + if isleaf { 8 } else { 0 } || (pgspc < full && last_off > P_FIRSTKEY) {
            let nblk = self.alloced;
            self.alloced += 1;
            let s = &mut self.levels[lvl];
            let mut old = std::mem::replace(&mut s.page, new_page(lvl as u32));
            let oblk = s.blkno;
            s.blkno = nblk;
            // The last item moves to the new page; its place on the old
            // page becomes the high key.
            let (at, len) = item(&old, last_off);
            let moved = old[at..at + len].to_vec();
            if isleaf {
                append(&mut s.page, &moved);
            } else {
                append(&mut s.page, &minus_infinity(&moved));
            }
            set_item(&mut old, P_HIKEY, at, len);
            put_u32(&mut old[..], pages::PAGE_HEADER + 4 * (last_off - 1), 0);
            let lower = pages::lower(&old);
            set_lower(&mut old, lower - 4);
            let hikey = if isleaf {
                // The next page's first key, without its heap TID (keys are
                // unique: the key alone separates the pages).
                let mut t = moved.clone();
                set_natts(&mut t, 1);
                old[at..at + len].copy_from_slice(&t);
                t
            } else {
                moved
            };
            if self.levels.len() == lvl + 1 {
                self.level(lvl + 1);
            }
            let mut low = self.levels[lvl]
                .lowkey
                .take()
                .expect("a page's low key is set when its first item is added");
            set_downlink(&mut low, oblk);
            self.add(lvl + 1, &low)?;
            let s = &mut self.levels[lvl];
            s.lowkey = Some(hikey);
            set_next(&mut old, nblk);
            set_prev(&mut s.page, oblk);
            (self.sink)(oblk, &mut old)?;
            last_off = P_FIRSTKEY;
        }
        let s = &mut self.levels[lvl];
        if last_off == P_HIKEY {
            s.lowkey = Some(minus_infinity(&[0u8; 8]));
        }
        last_off += 1;
        if !isleaf && last_off == P_FIRSTKEY {
            append(&mut s.page, &minus_infinity(itup));
        } else {
            let mut t = itup.to_vec();
            t.resize(size, 0);
            append(&mut s.page, &t);
        }
        s.last_off = last_off;
        Ok(())
    }

    /// Finishes the levels (each rightmost page without a high key, the
    /// top one the root) and writes the metapage; returns the index's
    /// blocks.
    pub fn finish(mut self) -> std::io::Result<u32> {
        let (mut root, mut root_level) = (0u32, 0u32);
        let mut lvl = 0;
        while lvl < self.levels.len() {
            let blk = self.levels[lvl].blkno;
            if lvl + 1 == self.levels.len() {
                let p = &mut self.levels[lvl].page;
                let f = flags(p);
                set_flags(p, f | BTP_ROOT);
                (root, root_level) = (blk, lvl as u32);
            } else {
                let mut low = self.levels[lvl]
                    .lowkey
                    .take()
                    .expect("every level's last page has a low key");
                set_downlink(&mut low, blk);
                self.add(lvl + 1, &low)?;
            }
            let s = &mut self.levels[lvl];
            // Rightmost: the line pointers slide back over the high key's.
            let n = max_offset(&s.page);
            for off in P_FIRSTKEY..=n {
                let at = pages::PAGE_HEADER + 4 * (off - 1);
                let lp = pages::get_u32(&s.page[..], at);
                put_u32(&mut s.page[..], at - 4, lp);
            }
            let lower = pages::lower(&s.page);
            set_lower(&mut s.page, lower - 4);
            let mut page = std::mem::replace(&mut s.page, Box::new([0u8; BLCKSZ]));
            (self.sink)(blk, &mut page)?;
            lvl += 1;
        }
        let mut meta = Box::new([0u8; BLCKSZ]);
        metapage(&mut meta, root, root_level);
        (self.sink)(0, &mut meta)?;
        Ok(self.alloced)
    }
}

/// The metapage: magic, version 4, root and fast root, their level, no
/// deleted pages, the heap tuple count unknown (-1), all keys equal-image.
fn metapage(p: &mut Page, root: u32, level: u32) {
    pages::init(p, SPECIAL);
    let m = pages::PAGE_HEADER;
    put_u32(&mut p[..], m, 0x053162);
    put_u32(&mut p[..], m + 4, 4);
    put_u32(&mut p[..], m + 8, root);
    put_u32(&mut p[..], m + 12, level);
    put_u32(&mut p[..], m + 16, root);
    put_u32(&mut p[..], m + 20, level);
    put_u32(&mut p[..], m + 24, 0);
    p[m + 32..m + 40].copy_from_slice(&(-1.0f64).to_le_bytes());
    p[m + 40] = 1;
    set_lower(p, m + 48);
    set_flags(p, BTP_META);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(n: u64) -> std::collections::BTreeMap<u32, Box<Page>> {
        let mut out = std::collections::BTreeMap::new();
        let mut b = Builder::new(|blk, p: &mut Page| {
            assert!(out.insert(blk, Box::new(*p)).is_none(), "block {blk} twice");
            Ok(())
        });
        for k in 1..=n {
            b.push(k, false, ((k / 61) as u32, (k % 61 + 1) as u16))
                .unwrap();
        }
        let blocks = b.finish().unwrap();
        assert_eq!(blocks as usize, out.len());
        out
    }

    /// CREATE INDEX's leaf fill: 366 keys and a high key per full leaf
    /// (90 %), every block written once, the root in the metapage.
    #[test]
    fn leaves_hold_what_create_index_puts_there() {
        let pages = build(1000);
        // Three leaves (366 + 366 + 268) and a root over them.
        assert_eq!(pages.len(), 5);
        let leaf = &pages[&1];
        assert_eq!(max_offset(leaf), 367);
        assert_eq!(flags(leaf), BTP_LEAF);
        let root = &pages[&3];
        assert_eq!(flags(root), BTP_ROOT);
        assert_eq!(max_offset(root), 3);
        assert_eq!(max_offset(&pages[&4]), 268);
        let meta = &pages[&0];
        assert_eq!(pages::get_u32(&meta[..], 32), 3);
        assert_eq!(pages::get_u32(&meta[..], 36), 1);
    }
}
