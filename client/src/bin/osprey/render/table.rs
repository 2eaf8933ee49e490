//! The aligned text table every renderer prints, and a JSON value as one of its cells.

/// An aligned table with a header rule.
pub fn render_table(header: &[String], rows: &[Vec<String>]) -> String {
    let clean = |s: &str| s.replace(['\n', '\t'], " ");
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(clean(cell).chars().count());
            }
        }
    }
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{:<w$}", clean(c), w = *w))
            .collect();
        format!("{}\n", parts.join(" | ").trim_end())
    };
    let mut out = line(header);
    out.push_str(&widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("-+-"));
    out.push('\n');
    for row in rows {
        out.push_str(&line(row));
    }
    out
}

/// A JSON value as a table cell: `-` for null, strings unquoted.
pub fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "-".to_string(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_aligned() {
        let t = render_table(
            &["id".into(), "name".into()],
            &[vec!["1".into(), "NULL".into()], vec!["100".into(), "bob".into()]],
        );
        assert_eq!(t, "id  | name\n----+-----\n1   | NULL\n100 | bob\n");
    }
}
