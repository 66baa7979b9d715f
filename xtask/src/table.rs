//! Plain-text tables for the terminal (comfy-table): each column as wide as its widest cell,
//! a dashed line under the header, no other borders.

use comfy_table::{Table, TableComponent};

/// A column of a table of `T`s: its header and how a row writes its cell.
pub type Column<'a, T> = (&'a str, &'a dyn Fn(&T) -> String);

/// Prints one row per item, a cell per column, each column as wide as its widest cell.
pub fn columns<T>(items: &[T], columns: &[Column<T>]) {
    let mut t = Table::new();
    // Only the line under the header: the 19 characters are comfy-table's border parts.
    t.load_preset("     -              ")
        .set_style(TableComponent::VerticalLines, ' ')
        .set_style(TableComponent::MiddleHeaderIntersections, ' ')
        .set_header(columns.iter().map(|(h, _)| *h))
        .add_rows(
            items
                .iter()
                .map(|x| columns.iter().map(|(_, cell)| cell(x))),
        );
    for c in t.column_iter_mut() {
        c.set_padding((0, 1));
    }
    println!("{}", t.trim_fmt());
}
