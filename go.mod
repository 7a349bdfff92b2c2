module github.com/xrcrun/xrc

go 1.26.0

require golang.org/x/sys v0.50.0

tool github.com/xrcrun/xrc/internal/cmd/mkabi
