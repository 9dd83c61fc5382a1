// Package console holds what the indexer's and the router's web consoles (GET
// /ui) share: the embedded static assets (HTML, CSS, JavaScript; no CDN, no
// external fonts, so the pages work offline and behind TLS), and Hub, the
// Server-Sent Events broadcaster that pushes the server's own state to the
// open pages.
//
// # Concurrency
//
// A Hub is safe for concurrent use. It builds a snapshot with its Snapshot
// function on one goroutine of its own, which runs only while at least one
// subscriber is connected, at most once per Interval, and never blocks on a
// subscriber: each subscriber holds at most one pending snapshot (a newer one
// replaces it), so a slow client only sees fewer updates. Subscribers are
// bounded by MaxSubscribers (more get 503), and every write to a client has a
// deadline, so a stuck connection ends instead of holding its goroutine.
// Series is a bounded, mutex-guarded ring safe for concurrent use.
package console
