// Why one long file: one state machine over YAML's token rules: its states and transitions are
// checked against each other, so they stay together.
//! A linear pre-scan that finds where a YAML text nests deeper than a bound, before the
//! parser sees it.
//!
//! libyaml's work per token grows with the number of open collections, so nesting makes
//! parsing quadratic: a 1 MB file nested 40,000 levels deep keeps serde_yaml busy for more
//! than a minute. This scan reads each byte once and follows libyaml's tokenizer closely
//! enough to tell which `[`, `{`, `- ` and `key:` open a collection and which are text: not
//! those in quoted scalars (which may span lines), block scalars (`|`, `>`), multi-line plain
//! scalars or comments. Where it cannot be exact it counts more, never less: every
//! compact `- - x` and indentless `key:\n- x` is a level, and `[a: b]` counts the
//! single-pair mapping libyaml builds inside the sequence. A flow collection that turns out
//! to be a mapping key (`[a]: b`) moves one level down once its `:` is seen.

mod lex;

use lex::{
    Plain, blank_or_end, document_marker, is_blank, lines, plain_end, quoted_end, skip_anchor,
    skip_blanks, skip_tag,
};

/// The 1-based line and column where `text` first nests deeper than `max` collections
/// (flow and block together), or `None` if it never does.
pub(super) fn too_deep(text: &str, max: usize) -> Option<(usize, usize)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut scan = Scan::new(max);
    for (number, line) in lines(text).enumerate() {
        if let Err(pos) = scan.line(line) {
            // `pos` is at an ASCII indicator, so a char boundary.
            let column = std::str::from_utf8(&line[..pos]).map_or(pos, |s| s.chars().count());
            return Some((number + 1, column + 1));
        }
    }
    None
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Map,
    Seq,
}

/// An open flow collection.
#[derive(Debug)]
struct Flow {
    seq: bool,
    /// A `:` or `?` made the current entry of this sequence a single-pair mapping.
    pair: bool,
    /// The deepest level reached inside the current entry (it moves one level down if the
    /// entry turns out to be a pair's key).
    entry_peak: usize,
    /// The deepest level reached inside this collection.
    peak: usize,
}

/// What a line hands on to the next.
#[derive(Debug, Clone, Copy)]
enum Carry {
    None,
    /// A plain scalar in block context that more-indented lines continue.
    Plain,
    /// An open `'` or `"` scalar.
    Quoted(u8),
    /// A block scalar's text: lines indented at least `content` (found from the first
    /// non-blank line when the header gives no indentation indicator).
    BlockScalar {
        parent: isize,
        content: Option<usize>,
        seen: usize,
    },
}

/// Where in a line the scan is.
#[derive(Debug, Clone, Copy)]
enum At {
    /// Where a block node may start.
    BlockToken,
    /// Right after a quoted scalar, alias or flow collection that began at `node`.
    BlockAfter { node: usize },
    /// Inside flow collections.
    Flow,
}

/// The scan's position within one line, between tokens.
struct Cursor {
    pos: usize,
    at: At,
    /// Where the block node being read began, properties (`&a`, `!t`) included.
    node: usize,
    /// The next token starts a block node.
    fresh: bool,
}

#[derive(Debug)]
struct Scan {
    max: usize,
    /// Open block collections, innermost last: their indentation and kind.
    blocks: Vec<(usize, Kind)>,
    flows: Vec<Flow>,
    /// Flow sequence entries that are single-pair mappings.
    pairs: usize,
    /// Column where the outermost open flow collection's node began.
    flow_node: usize,
    /// The deepest level the last outermost flow collection reached, until the next node.
    flow_peak: usize,
    /// Inside a plain scalar in flow context (they may span lines).
    in_plain: bool,
    carry: Carry,
}

impl Scan {
    fn new(max: usize) -> Self {
        Self {
            max,
            blocks: Vec::new(),
            flows: Vec::new(),
            pairs: 0,
            flow_node: 0,
            flow_peak: 0,
            in_plain: false,
            carry: Carry::None,
        }
    }

    fn depth(&self) -> usize {
        self.blocks.len() + self.flows.len() + self.pairs
    }

    /// libyaml's current block indentation: that of the innermost block collection.
    fn indent(&self) -> isize {
        self.blocks
            .last()
            .map_or(-1, |&(column, _)| column as isize)
    }

    /// One line, without its line break; `Err` holds the byte offset that went too deep.
    fn line(&mut self, l: &[u8]) -> Result<(), usize> {
        self.flow_peak = 0;
        let spaces = l.iter().take_while(|&&b| b == b' ').count();
        let blank = l[spaces..].iter().all(|&b| is_blank(b));
        match std::mem::replace(&mut self.carry, Carry::None) {
            Carry::None => {}
            Carry::BlockScalar {
                parent,
                content,
                seen,
            } => {
                if blank {
                    self.carry = Carry::BlockScalar {
                        parent,
                        content,
                        seen: seen.max(spaces),
                    };
                    return Ok(());
                }
                // libyaml: the most-indented leading line, but deeper than the parent.
                let least = usize::try_from(parent + 1).unwrap_or(0).max(1);
                let content = content.unwrap_or_else(|| seen.max(spaces).max(least));
                if spaces >= content {
                    self.carry = Carry::BlockScalar {
                        parent,
                        content: Some(content),
                        seen,
                    };
                    return Ok(());
                }
            }
            Carry::Quoted(quote) => {
                return match quoted_end(l, 0, quote) {
                    None => {
                        self.carry = Carry::Quoted(quote);
                        Ok(())
                    }
                    Some(end) if self.flows.is_empty() => {
                        self.run(l, end, At::BlockAfter { node: end })
                    }
                    Some(end) => self.run(l, end, At::Flow),
                };
            }
            Carry::Plain => {
                if blank {
                    self.carry = Carry::Plain;
                    return Ok(());
                }
                if l[spaces] == b'#' {
                    return Ok(());
                }
                if !document_marker(l) && spaces as isize > self.indent() {
                    return match plain_end(l, spaces) {
                        // A multi-line key: the parser rejects it; read on anyway.
                        Plain::Key(colon) => self.run(l, colon + 1, At::BlockToken),
                        Plain::Comment => Ok(()),
                        Plain::Line => {
                            self.carry = Carry::Plain;
                            Ok(())
                        }
                    };
                }
            }
        }
        if !self.flows.is_empty() {
            return self.run(l, 0, At::Flow);
        }
        if blank || l[spaces] == b'#' {
            return Ok(());
        }
        if document_marker(l) {
            self.blocks.clear();
            return self.run(l, 3, At::BlockToken);
        }
        if spaces == 0 && l[0] == b'%' {
            return Ok(()); // a directive
        }
        self.unroll(spaces);
        self.run(l, spaces, At::BlockToken)
    }

    /// Reads the tokens of `l` from `pos`.
    fn run(&mut self, l: &[u8], pos: usize, at: At) -> Result<(), usize> {
        let mut cursor = Cursor {
            pos,
            at,
            node: pos,
            fresh: true,
        };
        loop {
            cursor.pos = skip_blanks(l, cursor.pos);
            let Some(&c) = l.get(cursor.pos) else {
                return Ok(());
            };
            let more = match cursor.at {
                At::Flow => self.flow_token(l, c, &mut cursor)?,
                At::BlockAfter { node } => self.after_node(l, c, node, &mut cursor)?,
                At::BlockToken => self.block_token(l, c, &mut cursor)?,
            };
            if !more {
                return Ok(());
            }
        }
    }

    /// One token `c` inside flow collections; `false` when the rest of the line is read.
    fn flow_token(&mut self, l: &[u8], c: u8, cursor: &mut Cursor) -> Result<bool, usize> {
        let pos = cursor.pos;
        if self.in_plain {
            match c {
                b'#' if pos == 0 || is_blank(l[pos - 1]) => {
                    self.in_plain = false;
                    return Ok(false);
                }
                b':' if blank_or_end(l, pos + 1)
                    || matches!(l.get(pos + 1), Some(b',' | b'[' | b']' | b'{' | b'}')) =>
                {
                    self.in_plain = false;
                }
                b',' | b'[' | b']' | b'{' | b'}' => self.in_plain = false,
                _ => {
                    cursor.pos += 1;
                    return Ok(true);
                }
            }
        }
        match c {
            b'#' => return Ok(false),
            b'[' | b'{' => {
                self.push_flow(c == b'[', pos)?;
                cursor.pos += 1;
            }
            b']' | b'}' => {
                self.pop_flow();
                cursor.pos += 1;
                if self.flows.is_empty() {
                    cursor.at = At::BlockAfter {
                        node: self.flow_node,
                    };
                }
            }
            b',' => {
                self.next_entry();
                cursor.pos += 1;
            }
            b'?' | b':' => {
                self.pair(pos)?;
                cursor.pos += 1;
            }
            b'"' | b'\'' => match quoted_end(l, pos + 1, c) {
                None => {
                    self.carry = Carry::Quoted(c);
                    return Ok(false);
                }
                Some(end) => cursor.pos = end,
            },
            b'&' | b'*' => cursor.pos = skip_anchor(l, pos + 1),
            b'!' => cursor.pos = skip_tag(l, pos, true),
            _ => {
                self.in_plain = true;
                cursor.pos += 1;
            }
        }
        Ok(true)
    }

    /// One token `c` right after a block-level node that began at `node` (a quoted scalar,
    /// an alias or a flow collection): a `:` makes it a key.
    fn after_node(
        &mut self,
        l: &[u8],
        c: u8,
        node: usize,
        cursor: &mut Cursor,
    ) -> Result<bool, usize> {
        match c {
            b'#' => return Ok(false),
            b':' if blank_or_end(l, cursor.pos + 1) => {
                // A flow collection as a key of a new mapping: one level deeper.
                if self.open(Kind::Map, node)? && self.flow_peak >= self.max {
                    return Err(node);
                }
                cursor.pos += 1;
            }
            // Anything else is an error to the parser; keep reading tokens.
            _ => {}
        }
        self.flow_peak = 0;
        cursor.at = At::BlockToken;
        cursor.fresh = true;
        Ok(true)
    }

    /// One token `c` where a block node may start.
    fn block_token(&mut self, l: &[u8], c: u8, cursor: &mut Cursor) -> Result<bool, usize> {
        if cursor.fresh {
            cursor.node = cursor.pos;
            cursor.fresh = false;
        }
        let (pos, node) = (cursor.pos, cursor.node);
        match c {
            b'#' => return Ok(false),
            b'-' | b'?' | b':' if blank_or_end(l, pos + 1) => {
                let kind = if c == b'-' { Kind::Seq } else { Kind::Map };
                // After properties, `&a : b` is a key: its mapping is at `&a`.
                self.open(kind, node)?;
                cursor.pos += 1;
                cursor.fresh = true;
            }
            b'&' => cursor.pos = skip_anchor(l, pos + 1),
            b'!' => cursor.pos = skip_tag(l, pos, false),
            b'|' | b'>' => {
                self.block_scalar(l, pos + 1);
                return Ok(false);
            }
            b'[' | b'{' => {
                self.flow_node = node;
                self.push_flow(c == b'[', pos)?;
                cursor.pos += 1;
                cursor.at = At::Flow;
            }
            b'"' | b'\'' => match quoted_end(l, pos + 1, c) {
                None => {
                    self.carry = Carry::Quoted(c);
                    return Ok(false);
                }
                Some(end) => {
                    cursor.pos = end;
                    self.flow_peak = 0;
                    cursor.at = At::BlockAfter { node };
                }
            },
            b'*' => {
                cursor.pos = skip_anchor(l, pos + 1);
                self.flow_peak = 0;
                cursor.at = At::BlockAfter { node };
            }
            _ => match plain_end(l, pos) {
                Plain::Key(colon) => {
                    self.open(Kind::Map, node)?;
                    cursor.pos = colon + 1;
                    cursor.fresh = true;
                }
                Plain::Comment => return Ok(false),
                Plain::Line => {
                    self.carry = Carry::Plain;
                    return Ok(false);
                }
            },
        }
        Ok(true)
    }

    /// Closes the block collections indented more than `column`.
    fn unroll(&mut self, column: usize) {
        while self.blocks.last().is_some_and(|&(c, _)| c > column) {
            self.blocks.pop();
        }
    }

    /// A block collection of `kind` continues or starts at `column`; `true` if it starts.
    fn open(&mut self, kind: Kind, column: usize) -> Result<bool, usize> {
        self.unroll(column);
        match self.blocks.last() {
            Some(&(c, k)) if c == column && k == kind => return Ok(false),
            Some(&(c, Kind::Seq)) if c == column => {
                // A key at the column of an indentless sequence ends the sequence.
                self.blocks.pop();
                if self.blocks.last() == Some(&(column, Kind::Map)) {
                    return Ok(false);
                }
            }
            // `- ` at a mapping's own column: an indentless sequence, one level deeper.
            _ => {}
        }
        self.blocks.push((column, kind));
        self.check(column)?;
        Ok(true)
    }

    fn check(&self, pos: usize) -> Result<(), usize> {
        if self.depth() > self.max {
            Err(pos)
        } else {
            Ok(())
        }
    }

    fn push_flow(&mut self, seq: bool, pos: usize) -> Result<(), usize> {
        self.flows.push(Flow {
            seq,
            pair: false,
            entry_peak: 0,
            peak: 0,
        });
        self.check(pos)?;
        let depth = self.depth();
        let n = self.flows.len();
        self.flows[n - 1].peak = depth;
        if n >= 2 {
            let parent = &mut self.flows[n - 2];
            parent.entry_peak = parent.entry_peak.max(depth);
        }
        Ok(())
    }

    fn pop_flow(&mut self) {
        let Some(flow) = self.flows.pop() else {
            return;
        };
        if flow.pair {
            self.pairs -= 1;
        }
        match self.flows.last_mut() {
            Some(parent) => {
                parent.entry_peak = parent.entry_peak.max(flow.peak);
                parent.peak = parent.peak.max(flow.peak);
            }
            None => {
                self.flow_peak = flow.peak;
                self.in_plain = false;
            }
        }
    }

    fn next_entry(&mut self) {
        if let Some(flow) = self.flows.last_mut() {
            if flow.pair {
                flow.pair = false;
                self.pairs -= 1;
            }
            flow.entry_peak = 0;
        }
    }

    /// A `:` or `?` in flow context: in a sequence, the entry becomes a single-pair mapping,
    /// and what it holds so far moves one level down.
    fn pair(&mut self, pos: usize) -> Result<(), usize> {
        let Some(flow) = self.flows.last_mut() else {
            return Ok(());
        };
        if !flow.seq || flow.pair {
            return Ok(());
        }
        flow.pair = true;
        let moved = flow.entry_peak + 1;
        self.pairs += 1;
        let depth = self.depth();
        if let Some(flow) = self.flows.last_mut() {
            flow.peak = flow.peak.max(moved).max(depth);
        }
        if moved.max(depth) > self.max {
            Err(pos)
        } else {
            Ok(())
        }
    }

    /// After `|` or `>`: the header's indentation indicator, if any, fixes the text's
    /// indentation relative to the enclosing block collection.
    fn block_scalar(&mut self, l: &[u8], pos: usize) {
        let mut increment = 0;
        for &b in l.iter().skip(pos).take(2) {
            match b {
                b'1'..=b'9' => increment = usize::from(b - b'0'),
                b'+' | b'-' => {}
                _ => break,
            }
        }
        let parent = self.indent();
        let content =
            (increment > 0).then(|| usize::try_from(parent).map_or(increment, |p| p + increment));
        self.carry = Carry::BlockScalar {
            parent,
            content,
            seen: 0,
        };
    }
}

#[cfg(test)]
mod tests;
