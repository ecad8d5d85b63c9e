mod gguf;
