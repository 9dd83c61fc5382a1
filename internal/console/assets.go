package console

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed assets
var embedded embed.FS

// Assets is the embedded asset tree (console.css, console.js, indexer.html,
// indexer.js, router.html, router.js).
func Assets() fs.FS {
	sub, err := fs.Sub(embedded, "assets")
	if err != nil {
		panic(err)
	}
	return sub
}

// AssetHandler serves the embedded assets under prefix (e.g. "/ui/assets/").
// Responses carry a Content-Security-Policy that forbids any other origin.
func AssetHandler(prefix string) http.Handler {
	files := http.StripPrefix(prefix, http.FileServerFS(Assets()))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r)
			return
		}
		setHeaders(w)
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}

// ServePage writes the embedded HTML page name (e.g. "indexer.html").
func ServePage(w http.ResponseWriter, name string) {
	b, err := fs.ReadFile(Assets(), name)
	if err != nil {
		http.Error(w, "console page missing: "+name, http.StatusInternalServerError)
		return
	}
	setHeaders(w)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.Write(b)
}

func setHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
}
