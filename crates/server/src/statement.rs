//! What a SQL statement must pass before anything parses or plans it: a
//! size cap and a nesting-depth cap, both checked by one pass over the
//! statement's tokens (the tokenizer is a loop, no recursion).
//!
//! Why a depth cap: the parser builds a chain such as `1+1+...+1` or
//! `id = 1 OR id = 2 OR ...` as a left-deep tree without recursing, but
//! everything after it (planning, optimizing, the provider's filter
//! analysis, dropping the tree) walks that tree recursively, one stack
//! frame per operator: 200,000 operators overflowed the stack and aborted
//! the daemon. The cap keeps every statement that reaches the parser
//! shallow enough for the query threads' stacks (`crate::reads`).
//!
//! The depth is an upper bound on the depth of any expression or plan the
//! statement can produce: per parenthesis (bracket, brace) level, the
//! operators since the last comma at that level (a comma starts a new list
//! item: a projection, an argument, an `IN` value) plus the levels open.
//! Operators are symbols (`+`, `=`, `::`, ...) and the keywords that nest
//! (`AND`, `OR`, `NOT`, `IS`, `LIKE`, `IN`, `CASE`, `UNION`, `JOIN`, ...).
//! In a `FROM` list a comma nests too (each one is a cross join).

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

/// Why a statement is refused before it is parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Longer than `max` bytes (`query_max_sql_bytes`).
    TooLong { bytes: usize, max: usize },
    /// Nests operators deeper than `max` (`query_max_expr_depth`).
    TooDeep { depth: usize, max: usize },
    /// Does not tokenize (an unterminated string, ...).
    Malformed(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::TooLong { bytes, max } => write!(
                f,
                "the statement is {bytes} bytes, more than query_max_sql_bytes = {max}"
            ),
            Refusal::TooDeep { depth, max } => write!(
                f,
                "the statement nests operators at least {depth} deep, more than \
                 query_max_expr_depth = {max} (for many keys use `IN (...)`, not a chain of `OR`s)"
            ),
            Refusal::Malformed(e) => write!(f, "the statement does not tokenize: {e}"),
        }
    }
}

/// Checks `sql` against the size and depth caps (see the module docs).
pub(crate) fn check(sql: &str, max_bytes: usize, max_depth: usize) -> Result<(), Refusal> {
    if sql.len() > max_bytes {
        return Err(Refusal::TooLong {
            bytes: sql.len(),
            max: max_bytes,
        });
    }
    let tokens = Tokenizer::new(&GenericDialect {}, sql)
        .tokenize()
        .map_err(|e| Refusal::Malformed(e.to_string()))?;
    let depth = depth_of(&tokens, max_depth);
    if depth > max_depth {
        return Err(Refusal::TooDeep {
            depth,
            max: max_depth,
        });
    }
    Ok(())
}

/// One open parenthesis (or the statement's top level).
#[derive(Default)]
struct Level {
    /// Operators since the level opened or since its last comma.
    operators: usize,
    /// Inside a `FROM` list, where a comma is a cross join.
    from: bool,
}

/// The nesting bound of `tokens` (see the module docs); stops counting
/// once past `stop_past`.
fn depth_of(tokens: &[Token], stop_past: usize) -> usize {
    let mut levels = vec![Level::default()];
    // Operators counted in the levels below the innermost one.
    let mut below = 0usize;
    let mut deepest = 0usize;
    for token in tokens {
        let nested = match token {
            Token::Whitespace(_) | Token::Period | Token::Placeholder(_) | Token::EOF => false,
            Token::Word(w) => match w.keyword {
                Keyword::FROM => {
                    top(&mut levels).from = true;
                    false
                }
                Keyword::SELECT
                | Keyword::WHERE
                | Keyword::GROUP
                | Keyword::HAVING
                | Keyword::ORDER
                | Keyword::LIMIT
                | Keyword::OFFSET
                | Keyword::WINDOW
                | Keyword::QUALIFY => {
                    top(&mut levels).from = false;
                    false
                }
                Keyword::AND
                | Keyword::OR
                | Keyword::XOR
                | Keyword::NOT
                | Keyword::IS
                | Keyword::LIKE
                | Keyword::ILIKE
                | Keyword::SIMILAR
                | Keyword::REGEXP
                | Keyword::RLIKE
                | Keyword::BETWEEN
                | Keyword::IN
                | Keyword::CASE
                | Keyword::COLLATE
                | Keyword::AT
                | Keyword::DIV
                | Keyword::UNION
                | Keyword::INTERSECT
                | Keyword::EXCEPT
                | Keyword::MINUS
                | Keyword::JOIN => true,
                _ => false,
            },
            Token::Comma => {
                let level = top(&mut levels);
                if level.from {
                    true
                } else {
                    level.operators = 0;
                    false
                }
            }
            Token::LParen | Token::LBracket | Token::LBrace => {
                below += top(&mut levels).operators;
                levels.push(Level::default());
                false
            }
            Token::RParen | Token::RBracket | Token::RBrace => {
                if levels.len() > 1 {
                    levels.pop();
                    below -= top(&mut levels).operators;
                }
                false
            }
            Token::SemiColon => {
                levels = vec![Level::default()];
                below = 0;
                false
            }
            // Literals are leaves.
            Token::Number(..)
            | Token::Char(_)
            | Token::SingleQuotedString(_)
            | Token::DoubleQuotedString(_)
            | Token::TripleSingleQuotedString(_)
            | Token::TripleDoubleQuotedString(_)
            | Token::DollarQuotedString(_)
            | Token::SingleQuotedByteStringLiteral(_)
            | Token::DoubleQuotedByteStringLiteral(_)
            | Token::TripleSingleQuotedByteStringLiteral(_)
            | Token::TripleDoubleQuotedByteStringLiteral(_)
            | Token::SingleQuotedRawStringLiteral(_)
            | Token::DoubleQuotedRawStringLiteral(_)
            | Token::TripleSingleQuotedRawStringLiteral(_)
            | Token::TripleDoubleQuotedRawStringLiteral(_)
            | Token::NationalStringLiteral(_)
            | Token::EscapedStringLiteral(_)
            | Token::UnicodeStringLiteral(_)
            | Token::HexStringLiteral(_) => false,
            // Every other symbol is an operator of some kind.
            _ => true,
        };
        if nested {
            top(&mut levels).operators += 1;
        }
        let depth = below + top(&mut levels).operators + levels.len() - 1;
        deepest = deepest.max(depth);
        if deepest > stop_past {
            break;
        }
    }
    deepest
}

fn top(levels: &mut [Level]) -> &mut Level {
    levels
        .last_mut()
        .expect("the statement's top level is never popped")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(sql: &str) -> usize {
        let tokens = Tokenizer::new(&GenericDialect {}, sql).tokenize().unwrap();
        depth_of(&tokens, usize::MAX)
    }

    #[test]
    fn chains_count_their_operators_and_lists_do_not() {
        assert_eq!(depth("SELECT 1"), 0);
        // `+` x 3.
        assert_eq!(depth("SELECT 1+1+1+1"), 3);
        // Each projection and each IN value is its own item.
        assert_eq!(depth("SELECT a+b, c+d, e+f FROM t"), 1);
        let values: Vec<String> = (0..10_000).map(|i| i.to_string()).collect();
        let in_list = format!("SELECT * FROM t WHERE id IN ({})", values.join(", "));
        assert_eq!(depth(&in_list), 3, "`*`, IN, then one level open");
        // `=` and `OR` per key.
        let ors: Vec<String> = (0..100).map(|i| format!("id = {i}")).collect();
        let chain = format!("SELECT * FROM t WHERE {}", ors.join(" OR "));
        assert_eq!(depth(&chain), 200, "`*`, 100 `=`, 99 `OR`");
        // Nested calls and parentheses add their levels.
        assert_eq!(depth("SELECT f(g(h(1)))"), 3);
        assert_eq!(depth("SELECT ((((1))))"), 4);
        // Plus > Nested > Mul > Nested > Minus.
        assert_eq!(depth("SELECT 1 + (2 * (3 - 4))"), 5);
        // A FROM list nests (cross joins); a WHERE after it does not.
        assert_eq!(depth("SELECT * FROM a, b, c WHERE x = 1, y"), 4);
        assert_eq!(depth("SELECT 1 UNION SELECT 2 UNION SELECT 3"), 2);
        assert_eq!(depth("SELECT NOT NOT NOT x"), 3);
        assert_eq!(depth("SELECT x::int::int"), 2);
    }

    #[test]
    fn statements_past_either_cap_are_refused_naming_it() {
        assert_eq!(check("SELECT 1", 100, 10), Ok(()));
        assert_eq!(
            check("SELECT 1", 3, 10),
            Err(Refusal::TooLong { bytes: 8, max: 3 })
        );
        let deep = format!("SELECT 1{}", "+1".repeat(200_000));
        let refused = check(&deep, 1 << 20, 1000).unwrap_err();
        assert!(
            matches!(refused, Refusal::TooDeep { max: 1000, .. }),
            "{refused}"
        );
        assert!(refused.to_string().contains("query_max_expr_depth"));
        assert!(matches!(
            check("SELECT 'open", 100, 10),
            Err(Refusal::Malformed(_))
        ));
    }
}
