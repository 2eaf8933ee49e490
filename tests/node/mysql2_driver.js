'use strict';
// Node.js `mysql2` through Osprey's MySQL port or straight against the database:
// tests/tests/mysql/more_drivers.rs runs it both ways and compares the output line by
// line. `query` is the text protocol (placeholders filled in by the driver), `execute`
// the binary one (COM_STMT_PREPARE/EXECUTE). Everything printed must be deterministic:
// no time zone (dateStrings, timezone 'Z'), no floating ids, Buffers as hex, BigInt as
// strings.
//
// usage: node mysql2_driver.js host port user password database

const mysql = require('mysql2/promise');

const [host, port, user, password, database] = process.argv.slice(2);

// A driver that hangs must fail the test, not hold it forever.
setTimeout(() => {
  console.error('mysql2_driver.js: timed out after 60 s');
  process.exit(3);
}, 60000).unref();

function replacer(_key, value) {
  if (typeof value === 'bigint') return `bigint:${value}`;
  // JSON.stringify has already called Buffer#toJSON.
  if (value && value.type === 'Buffer' && Array.isArray(value.data)) {
    return `hex:${Buffer.from(value.data).toString('hex')}`;
  }
  return value;
}

function show(label, value) {
  console.log(`${label} ${JSON.stringify(value, replacer)}`);
}

// An OK packet as the driver sees it.
function header(h) {
  return {
    fieldCount: h.fieldCount,
    affectedRows: h.affectedRows,
    insertId: h.insertId,
    info: h.info,
    // Without the server's hints SERVER_QUERY_NO_GOOD_INDEX_USED and
    // SERVER_QUERY_NO_INDEX_USED (0x10, 0x20): the front end passes on the status
    // flags that describe the session (docs/MYSQL.md, "Results"), not those.
    serverStatus: h.serverStatus & ~0x30,
    warningStatus: h.warningStatus,
    changedRows: h.changedRows,
  };
}

// Column definitions: what the front end promises to pass on (docs/MYSQL.md,
// "Results"): not the schema nor the original names.
function fields(fs) {
  return (fs || []).map((f) => ({
    name: f.name,
    table: f.table,
    columnType: f.columnType,
    type: f.type,
    flags: f.flags,
    characterSet: f.characterSet,
    columnLength: f.columnLength,
    decimals: f.decimals,
  }));
}

async function error(label, promise) {
  try {
    await promise;
    show(label, 'no error');
  } catch (e) {
    show(label, { errno: e.errno, sqlState: e.sqlState, code: e.code, message: e.sqlMessage });
  }
}

async function main() {
  const c = await mysql.createConnection({
    host,
    port: Number(port),
    user,
    password,
    database,
    supportBigNumbers: true,
    bigNumberStrings: true,
    dateStrings: true,
    timezone: 'Z',
  });
  await c.query('DROP TABLE IF EXISTS node_t');
  await c.query(
    'CREATE TABLE node_t (id INT PRIMARY KEY AUTO_INCREMENT, i INT, u BIGINT UNSIGNED, ' +
      'd DECIMAL(20,6), t DATETIME(3), v VARCHAR(40), b BLOB, UNIQUE KEY uv (v)) ' +
      'ENGINE=InnoDB DEFAULT CHARSET=utf8mb4',
  );
  const insert = 'INSERT INTO node_t (i, u, d, t, v, b) VALUES (?, ?, ?, ?, ?, ?)';
  const blob = Buffer.from([0x00, 0xff, 0x00, 0x7f, 0x80, 0xff]);

  // The text protocol: the driver writes the values into the statement.
  let [h] = await c.query(insert, [
    -2147483648,
    '18446744073709551614',
    '-12345678901234.123456',
    '2024-02-29 23:59:59.123',
    'héllo wörld ✓ 日本 😀',
    blob,
  ]);
  show('query insert', header(h));
  [h] = await c.query(insert, [null, null, null, null, null, null]);
  show('query insert nulls', header(h));

  // The binary protocol: typed parameters.
  [h] = await c.execute(insert, [
    2147483647,
    '18446744073709551615',
    '0.000001',
    '1999-12-31 23:59:59.999',
    'ünïcödé ✓',
    blob,
  ]);
  show('execute insert', header(h));
  [h] = await c.execute(insert, [0, 9007199254740993n, 42.5, new Date(Date.UTC(2023, 0, 2, 3, 4, 5, 678)), '', Buffer.alloc(0)]);
  show('execute insert bigint and Date', header(h));
  [h] = await c.execute(insert, [null, null, null, null, null, null]);
  show('execute insert nulls', header(h));

  // A transaction: rolled back, then committed.
  await c.beginTransaction();
  [h] = await c.execute(insert, [1, '1', '1', '2001-01-01 00:00:00.000', 'rolled back', Buffer.from([0xff])]);
  show('in transaction insert', header(h));
  let [rows] = await c.query('SELECT COUNT(*) AS n, @@in_transaction AS tx FROM node_t');
  show('in transaction count', rows);
  await c.rollback();
  [rows] = await c.execute('SELECT COUNT(*) AS n, @@in_transaction AS tx FROM node_t WHERE v = ?', ['rolled back']);
  show('after rollback', rows);
  await c.beginTransaction();
  [h] = await c.query(insert, [2, '2', '2', '2002-02-02 02:02:02.002', 'committed', Buffer.from([0x00])]);
  show('in transaction insert 2', header(h));
  [h] = await c.execute('UPDATE node_t SET i = i + ? WHERE v = ?', [40, 'committed']);
  show('in transaction update', header(h));
  await c.commit();
  [rows] = await c.query('SELECT i, @@in_transaction AS tx FROM node_t WHERE v = ?', ['committed']);
  show('after commit', rows);

  // Duplicate keys, both protocols.
  await error('query duplicate', c.query(insert, [3, '3', '3', null, 'committed', null]));
  await error('execute duplicate', c.execute(insert, [3, '3', '3', null, 'committed', null]));
  await error('query syntax', c.query('SELEC 1'));
  await error('execute syntax', c.execute('SELEC ?', [1]));

  // Everything back, both protocols, with the column definitions.
  let f;
  [rows, f] = await c.query('SELECT * FROM node_t ORDER BY id');
  show('query fields', fields(f));
  for (const r of rows) show('query row', r);
  [rows, f] = await c.execute('SELECT * FROM node_t WHERE id >= ? ORDER BY id', [0]);
  show('execute fields', fields(f));
  for (const r of rows) show('execute row', r);
  [rows] = await c.query({ sql: 'SELECT id, v, b FROM node_t ORDER BY id', rowsAsArray: true });
  show('query rows as arrays', rows);
  // A Buffer is sent as a BLOB parameter: the server types `? AS b` by it.
  [rows, f] = await c.execute('SELECT ? + 1 AS a, CONCAT(?, \'x\') AS c, NULL AS n, ? AS b, HEX(?) AS h, ? AS u', [
    41,
    'é',
    Buffer.from([0x00, 0xff]),
    Buffer.from([0x00, 0xff]),
    '18446744073709551615',
  ]);
  show('execute expressions', rows);
  show('execute expressions fields', fields(f));
  [rows] = await c.execute('SELECT id FROM node_t WHERE id = ?', [999]);
  show('execute empty', rows);

  // affectedRows, changedRows and insertId of plain statements.
  [h] = await c.execute('UPDATE node_t SET i = ? WHERE i IS NULL', [7]);
  show('execute update', header(h));
  [h] = await c.query('UPDATE node_t SET i = 7 WHERE i = 7');
  show('query update unchanged', header(h));
  [h] = await c.query('DELETE FROM node_t WHERE i = ?', [7]);
  show('query delete', header(h));
  // Exactly these two are answered from the client's own last OK (docs/MYSQL.md).
  [rows] = await c.query('SELECT ROW_COUNT()');
  show('row count', rows);
  [h] = await c.execute('INSERT INTO node_t (v) VALUES (?)', ['last']);
  show('execute insert last', header(h));
  [rows] = await c.query('SELECT LAST_INSERT_ID()');
  show('last insert id', rows);
  await c.end();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
