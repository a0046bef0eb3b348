-- What decided a source's labels at its last scan: its default labels and, for an object store, where labels come
-- from and under which metadata key. A scan that finds it changed reads every object's labels again instead of
-- keeping the labels stored with objects that did not change (NULL: not known, read them all).
ALTER TABLE sources ADD COLUMN labelling text;
