mod train;
