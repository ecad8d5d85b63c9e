#!/usr/bin/env python3
"""Independent reference for src/sample/rng.rs: ChaCha20 (RFC 7539 block function, 64-bit counter,
zero nonce, as rand_chacha) and the key derivation, in plain Python. Prints the first u64 of the
streams pinned in rng.rs tests: python3 scripts/sample_rng_reference.py"""
import struct
def rotl(v,c): return ((v<<c)&0xffffffff)|(v>>(32-c))
def qr(s,a,b,c,d):
    s[a]=(s[a]+s[b])&0xffffffff; s[d]^=s[a]; s[d]=rotl(s[d],16)
    s[c]=(s[c]+s[d])&0xffffffff; s[b]^=s[c]; s[b]=rotl(s[b],12)
    s[a]=(s[a]+s[b])&0xffffffff; s[d]^=s[a]; s[d]=rotl(s[d],8)
    s[c]=(s[c]+s[d])&0xffffffff; s[b]^=s[c]; s[b]=rotl(s[b],7)
def block(key, counter=0):
    const=[0x61707865,0x3320646e,0x79622d32,0x6b206574]
    k=list(struct.unpack('<8I',key))
    st=const+k+[counter&0xffffffff,counter>>32,0,0]
    w=st[:]
    for _ in range(10):
        qr(w,0,4,8,12);qr(w,1,5,9,13);qr(w,2,6,10,14);qr(w,3,7,11,15)
        qr(w,0,5,10,15);qr(w,1,6,11,12);qr(w,2,7,8,13);qr(w,3,4,9,14)
    return struct.pack('<16I',*[(a+b)&0xffffffff for a,b in zip(w,st)])
assert block(bytes(32))[:8]==bytes([0x76,0xb8,0xe0,0xad,0xa0,0xf1,0x3d,0x90])
DOMAIN=b"rlcr.sample.rng.v1"
def encode(seed,pid,a,c):
    m=struct.pack('<Q',len(DOMAIN))+DOMAIN+struct.pack('<Q',seed)+struct.pack('<Q',len(pid.encode()))+pid.encode()+struct.pack('<I',a)
    m+= bytes(5) if c is None else b'\x01'+struct.pack('<I',c)
    return m
def derive(m):
    h=bytes(32)
    for i in range(0,len(m),32):
        b=m[i:i+32].ljust(32,b'\0')
        k=bytes(x^y for x,y in zip(h,b))
        out=block(k)[:32]
        h=bytes(x^y for x,y in zip(out,b))
    return h
for args in [(0,"countdown-0",0,None),(3,"p",1,2)]:
    key=derive(encode(*args))
    print(hex(struct.unpack('<Q',block(key)[:8])[0]))
