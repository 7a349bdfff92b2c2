#include "textflag.h"

// func Addrs(a []uintptr)
TEXT ·Addrs(SB), NOSPLIT, $0-24
	MOVQ a_base+0(FP), SI
	MOVQ a_len+8(FP), CX
	TESTQ CX, CX
	JZ done
loop:
	MOVQ (SI), AX
	PREFETCHT0 (AX)
	ADDQ $8, SI
	DECQ CX
	JNZ loop
done:
	RET
