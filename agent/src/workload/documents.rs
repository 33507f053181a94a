//! A shared step: the JSON order documents of the TOAST-probe article's
//! JSON test, which toast-probe stores per storage mode and
//! compression-analysis analyses page by page.

use tokio_postgres::Client;

use crate::Result;

/// Order documents: `items` line items with the same five keys each.
const JSON_SOURCE: &str = "INSERT INTO {table} \
    SELECT d, jsonb_build_object( \
      'order_id', d, 'customer', 'customer-' || lpad((floor(random() * 50000))::int::text, 5, '0'), \
      'status', (ARRAY['new', 'paid', 'shipped', 'delivered'])[1 + floor(random() * 4)::int], \
      'created_at', to_char(timestamptz '2026-01-01 00:00:00+00' + d * interval '37 seconds', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), \
      'items', (SELECT jsonb_agg(jsonb_build_object( \
          'sku', 'SKU-' || lpad((floor(random() * 100000))::int::text, 6, '0'), \
          'name', (ARRAY['Widget', 'Gadget', 'Sprocket', 'Gizmo', 'Doohickey', 'Thingamajig'])[1 + floor(random() * 6)::int] \
                  || ' ' || (ARRAY['small', 'medium', 'large', 'deluxe'])[1 + floor(random() * 4)::int] || ' #' || floor(random() * 1000)::int, \
          'qty', 1 + floor(random() * 10)::int, \
          'price_cents', 99 + floor(random() * 99900)::int, \
          'tags', jsonb_build_array((ARRAY['red', 'blue', 'green', 'sale', 'new', 'eco'])[1 + floor(random() * 6)::int], \
                                    (ARRAY['home', 'garden', 'office', 'outdoor'])[1 + floor(random() * 4)::int]))) \
        FROM generate_series(1, n))) \
    FROM (SELECT d, $2::int + floor(random() * ($3::int - $2::int + 1))::int AS n FROM generate_series(1, $1::int) d) s";

/// Fills `table (id int, body jsonb)` with `documents` order documents of
/// `items` line items, drawn after `setseed(seed)`.
pub async fn load_documents(
    client: &Client,
    table: &str,
    documents: u32,
    items: (u32, u32),
    seed: f64,
) -> Result<()> {
    client.execute("SELECT setseed($1)", &[&seed]).await?;
    client
        .execute(
            &JSON_SOURCE.replace("{table}", table),
            &[&(documents as i32), &(items.0 as i32), &(items.1 as i32)],
        )
        .await?;
    Ok(())
}
