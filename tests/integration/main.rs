mod advantage;
