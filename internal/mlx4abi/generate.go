package mlx4abi

//go:generate go tool mkabi -types types_linux.go -out zabi_linux.go -layout zlayout_test.go
